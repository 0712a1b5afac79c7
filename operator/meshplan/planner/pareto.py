"""The throughput-vs-interactivity Pareto frontier (NVIDIA's trillion-parameter blog picture).

Every evaluated candidate is a point (tokens/s/user, tokens/s/GPU). A point is
on the frontier when no other point is at least as good on both axes and
better on one. Algorithm: sort by throughput descending (interactivity
descending to break ties), sweep once and keep a point only when its
interactivity beats every point kept before it — O(n log n), and exact
duplicates keep the first one seen, so the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from meshplan.planner.types import Candidate

T = TypeVar("T")


def throughput_of(c: Candidate) -> float:
    return c.prediction.tokens_per_s_per_gpu


def interactivity_of(c: Candidate) -> float:
    return c.prediction.tokens_per_s_per_user


def pareto_frontier(
    items: Iterable[T],
    throughput: Callable[[T], float] = throughput_of,  # type: ignore[assignment]
    interactivity: Callable[[T], float] = interactivity_of,  # type: ignore[assignment]
) -> tuple[T, ...]:
    """Non-dominated items (maximising both keys), ordered by interactivity ascending.

    That order is the frontier as drawn: left (slow per user, high throughput)
    to right (fast per user, low throughput).
    """
    keyed = [(throughput(c), interactivity(c), n, c) for n, c in enumerate(items)]
    keyed.sort(key=lambda k: (-k[0], -k[1], k[2]))
    frontier: list[T] = []
    best_interactivity = float("-inf")
    for _, i, _, item in keyed:
        if i > best_interactivity:
            frontier.append(item)
            best_interactivity = i
    return tuple(frontier)


def dominates(a: T, b: T, throughput: Callable[[T], float] = throughput_of,  # type: ignore[assignment]
              interactivity: Callable[[T], float] = interactivity_of) -> bool:  # type: ignore[assignment]
    """`a` is at least as good as `b` on both axes and better on one."""
    ta, tb, ia, ib = throughput(a), throughput(b), interactivity(a), interactivity(b)
    return ta >= tb and ia >= ib and (ta > tb or ia > ib)


__all__ = ["pareto_frontier", "dominates", "throughput_of", "interactivity_of"]


def thin(points: Sequence[T], n: int) -> tuple[T, ...]:
    """At most `n` of `points`, evenly spaced along them (the first and the last kept)."""
    if len(points) <= n:
        return tuple(points)
    step = (len(points) - 1) / (n - 1)
    return tuple(points[round(i * step)] for i in range(n))
