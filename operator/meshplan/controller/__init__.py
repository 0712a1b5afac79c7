"""The operator: thin kopf handlers around the pure core (see docs/architecture.md).

Modules
- `settings`   kopf settings: own finalizer and annotation prefix, watch timeouts, events, peering.
- `indexes`    kopf indexes of GPU Nodes and GPU-holding Pods (the topology, kept current by watches)
               and of LLMDeployments (for the periodic resync and child-triggered reconciles).
- `kube`       a small asyncio client of the Kubernetes REST API (aiohttp, the library kopf uses):
               list, server-side apply, delete, status patch. Never blocks the event loop.
- `apply`      the ONE server-side-apply helper (field manager `meshplan`).
- `status`     the ONE condition helper and the status document.
- `decide`     pure: children as they are + the rendered children -> the actions of one reconcile
               (create, release, roll, delete) with the all-or-nothing and rolling-update rules.
- `reconcile`  read the world once -> plan (cached) -> place -> render -> decide -> apply -> status once.
- `handlers`   kopf handlers: create/update/resume call `reconcile`; child events and a resync loop
               queue it; nothing else.
"""
