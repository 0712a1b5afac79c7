"""kopf settings for meshplan (applied in the startup handler).

Why each one (docs/reliability.md, "Known kopf pitfalls")
- Own finalizer `meshplan.dev/finalizer` and own annotation prefix `meshplan.dev`
  for kopf's progress and diff-base records: two kopf operators in one cluster
  never read each other's markers. meshplan registers no deletion handler,
  timer or daemon on LLMDeployments, so kopf adds NO finalizer at all: children
  are garbage-collected through their ownerReferences, and deleting an
  LLMDeployment never hangs when the operator is gone. The name is set so that
  any later handler that needs one uses ours.
- Progress and diff-base in annotations, not in `status.kopf`: the CRD's status
  schema is generated from the models and would prune kopf's fields.
- Progress storage (`AnnotationsProgressStorage`, one small record per handler
  while it is being retried, purged when it succeeds): kept as kopf ships it,
  because it is what makes kopf retry a failed create/update/resume handler
  with backoff (`ERROR_BACKOFFS_S`) and resume the count after a restart.
- Diff-base storage (`DigestDiffBaseStorage`): a SHA-256 digest of the
  "essence" (spec, labels, annotations) instead of kopf's default copy of the
  whole essence. kopf still needs a diff base to tell create from update from
  "nothing changed" (the handlers registered with `on.create`/`on.update`/
  `on.resume` in handlers.py), but meshplan's handlers never read kopf's `diff`,
  `old` or `new`: every path is a reconcile that reads the world itself. A copy
  of a spec near the schema maxima (~600 KB of engine env and args, scenario 11)
  exceeds the API server's 256 KiB limit on all annotations together, kopf's
  patch then failed with 422 and kopf retried it forever (docs/reliability.md,
  F7). A digest is 71 bytes whatever the spec. The price: the `diff` kopf passes
  to an update handler is meaningless (it compares the new essence with a
  one-field placeholder); no meshplan handler reads it.
- Watch timeouts: server-side 5 min (the API server closes the stream; kopf
  reconnects and resumes), client-side a little longer, connect 30 s. Without
  them a silently dead TCP stream stalls a watch forever (kopf <1.44 issue).
- Events: kopf posts its own log lines of WARNING and above as Kubernetes
  events; the reconciler posts its transition events itself.
- Peering: standalone unless a peering name is given (then only the operator
  with the highest priority acts; see `meshplan run --peering`). kopf pauses
  only its own handlers and watches; meshplan's own queue and resync (which
  LISTs objects itself) ask `outranked` first, reading kopf's peering object.
- Errors: a handler that fails unexpectedly is retried with a growing delay
  (1 s, 2 s, 5 s, 10 s, 30 s, then every 60 s), never dropped.
- Listed namespaces (`notice_listed_namespaces`): kopf's namespace observer (kopf 1.44-1.45,
  `kopf/_core/reactor/observation.py`) lists namespaces once, then starts a watcher that lists
  them again and watches from that second listing's resourceVersion, and its event processor
  drops every listed (type None) event. A namespace created between the two listings, or
  during a re-list after the watch's "410 Gone", is in no ADDED event and in no listing kopf
  reads: kopf never serves it (docs/reliability.md, L1 and its cause). meshplan wraps the
  processor so a listed namespace is revised like an added one (additions only: a listing
  carries no deletion).
- Engine-pod policy (`load_engine_policy`): the cluster admin's `enginePolicy` chart values
  (allowed images per engine, env valueFrom, engine pods' ServiceAccount), passed by the chart as
  the JSON env MESHPLAN_ENGINE_POLICY; unset -> the chart's defaults (meshplan.api.policy). A value
  the operator cannot read stops it at start with the key named (never a silently wider policy).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from typing import Any, Mapping

import kopf

FINALIZER = "meshplan.dev/finalizer"
ANNOTATION_PREFIX = "meshplan.dev"
WATCH_SERVER_TIMEOUT_S = 300
WATCH_CLIENT_TIMEOUT_S = 330
WATCH_CONNECT_TIMEOUT_S = 30
ERROR_BACKOFFS_S = (1, 2, 5, 10, 30, 60)
DIGEST_KEY = "last-handled-digest"
# kopf's default diff-base key, which earlier meshplan versions filled with the whole essence:
# still read once (an object handled before the upgrade is not taken for a new one), then removed.
LEGACY_DIFFBASE_KEY = "last-handled-configuration"
DIGEST_PREFIX = "sha256:"


def essence_digest(essence: Any) -> str:
    """`sha256:<hex>` of an essence, independent of key order."""
    encoded = json.dumps(essence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return DIGEST_PREFIX + hashlib.sha256(encoded.encode("utf-8")).hexdigest()


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff-base storage, storing a digest of the essence instead of the essence.

    `fetch` answers kopf's question "what did the object look like when it was
    last handled?" as follows: no digest stored -> None (kopf: a new object,
    `create`); the digest of the object's current essence equals the stored one
    -> the current essence (kopf: no change, nothing to do, or `resume` at
    startup); else a placeholder that differs from any real essence (kopf:
    `update`). `store` writes the digest and drops the legacy full copy.
    Neither annotation is part of the essence: once kopf's `<prefix>/kopf-managed`
    marker is on the object (stored with the first digest), kopf leaves every
    annotation under the prefix out of it.
    """

    def __init__(self, prefix: str = ANNOTATION_PREFIX) -> None:
        super().__init__(prefix=prefix, key=DIGEST_KEY)

    def fetch(self, *, body: Any) -> Any:
        annotations = body.metadata.annotations
        for key in self.make_keys(self.key, body=body):
            stored = annotations.get(key)
            if stored is None:
                continue
            current = self.build(body=body)
            if essence_digest(current) == stored.strip():
                return current
            return {"metadata": {"annotations": {key: stored.strip()}}}   # differs: an update
        for key in self.make_keys(LEGACY_DIFFBASE_KEY, body=body):
            encoded = annotations.get(key)
            if encoded is not None:
                return json.loads(encoded)
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        for key in self.make_keys(self.key, body=body):
            patch.metadata.annotations[key] = essence_digest(essence)
        for key in self.make_keys(LEGACY_DIFFBASE_KEY, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None
        self._store_marker(prefix=self.prefix, patch=patch, body=body)


def notice_listed_namespaces() -> bool:
    """Make kopf's namespace observer revise the namespaces its watcher's own listing returns (see the
    module docstring). True when kopf's processor is wrapped (now or before); False, with a warning,
    when this kopf has no such processor (then nothing is changed)."""
    try:
        from kopf._core.reactor import observation
    except ImportError:           # pragma: no cover - kopf reorganised: nothing to wrap
        observation = None
    original = getattr(observation, "process_discovered_namespace_event", None)
    revise = getattr(observation, "revise_namespaces", None)
    if original is None or revise is None:
        logging.getLogger("meshplan.controller").warning(
            "kopf has no namespace observer processor to wrap: namespaces listed at a watch (re)start may go "
            "unnoticed until the resync's LIST (docs/reliability.md, L1)")
        return False
    if getattr(original, "_meshplan_listed", False):
        return True

    async def process_discovered_namespace_event(*, raw_event: Any, namespaces: Any, insights: Any,
                                                 **kwargs: Any) -> None:
        if raw_event.get("type") is None:
            async with insights.revised:
                revise(raw_events=[raw_event], insights=insights, namespaces=namespaces)
                insights.revised.notify_all()
            return
        await original(raw_event=raw_event, namespaces=namespaces, insights=insights, **kwargs)

    process_discovered_namespace_event._meshplan_listed = True     # type: ignore[attr-defined]
    process_discovered_namespace_event.__wrapped__ = original      # type: ignore[attr-defined]
    observation.process_discovered_namespace_event = process_discovered_namespace_event
    return True


def load_engine_policy(environ: Mapping[str, str] | None = None) -> Any:
    """The admin's EnginePolicy from $MESHPLAN_ENGINE_POLICY (JSON of the chart's enginePolicy)."""
    import os

    from meshplan.api.policy import POLICY_ENV, EnginePolicy

    raw = (os.environ if environ is None else environ).get(POLICY_ENV, "").strip()
    if not raw:
        return EnginePolicy()
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"${POLICY_ENV} is not JSON ({exc}); it holds the chart's enginePolicy values") from exc
    if not isinstance(values, dict):
        raise ValueError(f"${POLICY_ENV} must be a JSON object (the chart's enginePolicy values)")
    return EnginePolicy.from_values(values)


def outranked(peers: Mapping[str, Any], priority: int, now: datetime.datetime) -> bool:
    """Whether kopf would pause an operator of `priority`, given the status of its peering object.

    kopf's rule (kopf/_core/engines/peering.py, `process_peering_event`): pause
    while another live peer has a higher priority, or the same priority. The
    status maps each peer's id to {priority, lifetime (s), lastseen (ISO 8601)};
    a peer is live until lastseen + lifetime. This operator's own record is in
    it too, hence "more than one" for the same priority.
    """
    same = 0
    for info in peers.values():
        if not isinstance(info, Mapping):
            continue
        try:
            seen = datetime.datetime.fromisoformat(str(info.get("lastseen")))
            if seen.tzinfo is None:
                seen = seen.replace(tzinfo=datetime.timezone.utc)
            alive = seen + datetime.timedelta(seconds=int(info.get("lifetime", 60))) > now
            peer_priority = int(info.get("priority", 0))
        except (TypeError, ValueError):
            continue
        if not alive:
            continue
        if peer_priority > priority:
            return True
        same += peer_priority == priority
    return same > 1


def configure(settings: Any, *, peering: str | None = None, priority: int = 0,
              max_workers: int = 8) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = DigestDiffBaseStorage()
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_S
    settings.watching.connect_timeout = WATCH_CONNECT_TIMEOUT_S
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING
    settings.queueing.error_delays = ERROR_BACKOFFS_S
    settings.execution.max_workers = max_workers
    if peering:
        settings.peering.name = peering
        settings.peering.priority = priority
        settings.peering.standalone = False
    else:
        settings.peering.standalone = True
