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
- Watch timeouts: server-side 5 min (the API server closes the stream; kopf
  reconnects and resumes), client-side a little longer, connect 30 s. Without
  them a silently dead TCP stream stalls a watch forever (kopf <1.44 issue).
- Events: kopf posts its own log lines of WARNING and above as Kubernetes
  events; the reconciler posts its transition events itself.
- Peering: standalone unless a peering name is given (then only the operator
  with the highest priority acts; see `meshplan run --peering`).
- Errors: a handler that fails unexpectedly is retried with a growing delay
  (1 s, 2 s, 5 s, 10 s, 30 s, then every 60 s), never dropped.
"""

from __future__ import annotations

import logging
from typing import Any

FINALIZER = "meshplan.dev/finalizer"
ANNOTATION_PREFIX = "meshplan.dev"
WATCH_SERVER_TIMEOUT_S = 300
WATCH_CLIENT_TIMEOUT_S = 330
WATCH_CONNECT_TIMEOUT_S = 30
ERROR_BACKOFFS_S = (1, 2, 5, 10, 30, 60)


def configure(settings: Any, *, peering: str | None = None, priority: int = 0,
              max_workers: int = 8) -> None:
    import kopf

    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_S
    settings.watching.connect_timeout = WATCH_CONNECT_TIMEOUT_S
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING
    settings.batching.error_delays = ERROR_BACKOFFS_S
    settings.execution.max_workers = max_workers
    if peering:
        settings.peering.name = peering
        settings.peering.priority = priority
        settings.peering.standalone = False
    else:
        settings.peering.standalone = True
