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

import logging
from typing import Any, Mapping

from meshplan.controller.kube import ApiError, Kube

log = logging.getLogger("meshplan.controller")

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


# Items the API server's admission plugins add to every pod it creates (kube-apiserver defaults):
# - DefaultTolerationSeconds (plugin/pkg/admission/defaulttolerationseconds): NoExecute tolerations of
#   node.kubernetes.io/not-ready and node.kubernetes.io/unreachable with tolerationSeconds 300;
# - ServiceAccount (plugin/pkg/admission/serviceaccount): the projected token volume
#   `kube-api-access-<suffix>` and its mount in every container.
# They are not drift: without skipping them every reconcile re-applied every pod (a no-op request
# per pod per reconcile, F6).
_ADMISSION_TOLERATIONS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _added_by_admission(item: Any) -> bool:
    if not isinstance(item, Mapping):
        return False
    if item.get("key") in _ADMISSION_TOLERATIONS and item.get("effect") == "NoExecute" \
            and "tolerationSeconds" in item:
        return True
    return str(item.get("name", "")).startswith("kube-api-access-")


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field of `desired` has the same value in `live` (lists compared item by item,
    leaving out of `live` the items admission adds by itself, see `_added_by_admission`)."""
    if isinstance(desired, (list, Mapping)) and not desired and live is None:
        return True      # an empty list/map is not stored: absent on the server
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list):
            return False
        if len(desired) != len(live):
            live = [item for item in live if not _added_by_admission(item)]
            if not desired and not live:
                return True
            if len(desired) != len(live):
                return False
        return all(is_subset(d, l) for d, l in zip(desired, live))
    return _norm(desired) == _norm(live)


def first_difference(desired: Any, live: Any, path: str = "") -> str | None:
    """The first field path where `is_subset(desired, live)` fails (for the debug log), or None."""
    if is_subset(desired, live):
        return None
    if isinstance(desired, Mapping) and isinstance(live, Mapping):
        for k, v in desired.items():
            d = first_difference(v, live.get(k), f"{path}.{k}" if path else str(k))
            if d is not None:
                return d
    if isinstance(desired, list) and isinstance(live, list) and len(desired) == len(live):
        for i, (d_, l_) in enumerate(zip(desired, live)):
            d = first_difference(d_, l_, f"{path}[{i}]")
            if d is not None:
                return d
    return f"{path}: want {str(desired)[:200]}, have {str(live)[:200]}"


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a desired object that apply would set (apiVersion/kind are not stored fields)."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}


def needs_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    return live is None or not is_subset(_comparable(desired), live)


async def apply(kube: Kube, desired: Mapping[str, Any], live: Mapping[str, Any] | None = None) -> bool:
    """Server-side apply `desired` unless `live` already matches; True when a request was sent."""
    if not needs_apply(desired, live):
        return False
    if live is not None and log.isEnabledFor(logging.DEBUG):
        log.debug("applying %s %s: %s", desired["kind"], desired["metadata"]["name"],
                  first_difference(_comparable(desired), live))
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
