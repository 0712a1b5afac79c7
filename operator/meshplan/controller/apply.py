"""The ONE way meshplan writes children: server-side apply under field manager `meshplan`.

Why server-side apply: the API server merges our intent field by field and
records that `meshplan` owns exactly the fields it sent, so other controllers
(the scheduler binding a pod, kube-controller-manager filling a Service's
clusterIP) and admission defaults never conflict with us, and fields we stop
sending are removed. With `force=true` a conflict on one of OUR fields (a user
edited the pod's labels or the Service's selector) is resolved in our favour,
which is how drift is undone; fields we never send are left alone.

Zero writes when nothing changed: before applying, the desired object is
compared with the live one (`is_subset`: every field we would send already
has that value). A second reconcile of an unchanged world therefore sends no
request at all (reliability checklist #1).

Errors: 409 Conflict -> `kopf.TemporaryError` with a short delay (kopf does
not retry 4xx by itself, and a conflict is transient); 422 Invalid on an
existing object (an immutable pod field differs) -> `ImmutableFieldChanged`,
which the reconciler answers by replacing the replica group.
"""

from __future__ import annotations

from typing import Any, Mapping

from meshplan.controller.kube import ApiError, Kube

FIELD_MANAGER = "meshplan"
CONFLICT_RETRY_DELAY_S = 1.0


class ImmutableFieldChanged(Exception):
    """The live object differs in a field the API server does not let us change."""


def _norm(v: Any) -> Any:
    # The API server returns quantities and ports as given, but int-or-string fields
    # may come back as either; compare their string forms.
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return str(v)
    return v


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field of `desired` has the same value in `live` (lists compared item by item)."""
    if isinstance(desired, (list, Mapping)) and not desired and live is None:
        return True      # an empty list/map is not stored: absent on the server
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, l) for d, l in zip(desired, live))
    return _norm(desired) == _norm(live)


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a desired object that apply would set (apiVersion/kind are not stored fields)."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}


def needs_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    return live is None or not is_subset(_comparable(desired), live)


async def apply(kube: Kube, desired: Mapping[str, Any], live: Mapping[str, Any] | None = None) -> bool:
    """Server-side apply `desired` unless `live` already matches; True when a request was sent."""
    if not needs_apply(desired, live):
        return False
    try:
        await kube.apply(desired, FIELD_MANAGER, force=True)
    except ApiError as exc:
        if exc.status == 409:
            import kopf

            raise kopf.TemporaryError(f"conflict applying {desired['kind']} {desired['metadata']['name']}: "
                                      f"{exc.message}", delay=CONFLICT_RETRY_DELAY_S) from exc
        if exc.status == 422 and live is not None:
            raise ImmutableFieldChanged(f"{desired['kind']} {desired['metadata']['name']}: {exc.message}") from exc
        raise
    return True


__all__ = ["FIELD_MANAGER", "ImmutableFieldChanged", "apply", "is_subset", "needs_apply"]
