"""`meshplan cleanup`: delete every LLMDeployment in scope and wait until they are gone.

Why: `helm uninstall` deletes the operator, but LLMDeployments carry the
operator's finalizer. Deleted after the operator, they would stay Terminating
for ever (and a later CRD deletion would hang on them). The chart's pre-delete
hook runs this command while the operator still runs, so the operator tears
each deployment down and releases its finalizer; pods, Services and
ComputeDomains go with it through ownerReferences.

Algorithm:
1. list LLMDeployments (all namespaces, or each `--namespace`);
2. delete each with `propagationPolicy: Foreground`, so an LLMDeployment only
   disappears after the garbage collector has deleted its children: "gone"
   then means "gone with its children";
3. poll until none is left or `--timeout-seconds` pass;
4. on timeout with `--remove-finalizers-on-timeout` (the operator is gone or
   stuck), remove meshplan's own finalizers (not anyone else's) from what is
   left and wait once more; exit 1 naming whatever still remains.

The chart runs it as `python -m meshplan.commands.cleanup ...` (the image's
venv python) so it does not depend on the subcommand table; registered in
`meshplan.cli` it is also `meshplan cleanup ...`. Credentials: in-cluster
ServiceAccount when present, else $KUBECONFIG / ~/.kube/config.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Iterable, Sequence

from meshplan.api.models import GROUP, PLURAL, VERSION

# Finalizers meshplan may own: its own prefix, and kopf's default marker for an
# operator that did not set `settings.persistence.finalizer`
# (kopf/_cogs/configs/configuration.py, PersistenceSettings.finalizer).
OWN_FINALIZER_PREFIX = "meshplan.dev/"
KOPF_DEFAULT_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
POLL_INTERVAL_S = 2.0
FINALIZER_GRACE_S = 60.0


def is_own_finalizer(finalizer: str) -> bool:
    return finalizer.startswith(OWN_FINALIZER_PREFIX) or finalizer == KOPF_DEFAULT_FINALIZER


def finalizers_without_own(finalizers: Iterable[str]) -> list[str]:
    """The finalizers to keep: everyone else's (the GC's `foregroundDeletion`, other controllers')."""
    return [f for f in finalizers if not is_own_finalizer(f)]


def describe(items: Sequence[dict[str, Any]]) -> str:
    """`ns/name [finalizers: ...]` per object, for the error message."""
    parts = []
    for it in items:
        meta = it.get("metadata", {})
        fins = ", ".join(meta.get("finalizers") or []) or "none"
        parts.append(f"{meta.get('namespace')}/{meta.get('name')} [finalizers: {fins}]")
    return "; ".join(parts)


class _Api:
    """The few calls cleanup makes, on kubernetes' CustomObjectsApi."""

    def __init__(self) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self._client = client
        self.custom = client.CustomObjectsApi()

    def list(self, namespaces: Sequence[str] | None) -> list[dict[str, Any]]:
        if namespaces is None:
            return self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        items: list[dict[str, Any]] = []
        for ns in namespaces:
            items += self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        return items

    def delete(self, ns: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name,
                body=self._client.V1DeleteOptions(propagation_policy="Foreground"))
        except self._client.ApiException as exc:
            if exc.status != 404:
                raise

    def set_finalizers(self, ns: str, name: str, resource_version: str, finalizers: list[str]) -> None:
        # resourceVersion makes the merge patch conditional: a concurrent change wins, we retry next round.
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}}
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body)
        except self._client.ApiException as exc:
            if exc.status not in (404, 409):
                raise


def _wait_empty(api: _Api, namespaces: Sequence[str] | None, timeout_s: float, log) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    left = api.list(namespaces)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
        left = api.list(namespaces)
    return left


def cleanup(namespaces: Sequence[str] | None, timeout_s: float, remove_finalizers: bool,
            api: _Api | None = None, log=print) -> int:
    api = api or _Api()
    scope = "all namespaces" if namespaces is None else ", ".join(namespaces)
    items = api.list(namespaces)
    log(f"meshplan cleanup: {len(items)} LLMDeployment(s) in {scope}")
    for it in items:
        meta = it["metadata"]
        api.delete(meta["namespace"], meta["name"])
        log(f"  deleting {meta['namespace']}/{meta['name']}")
    left = _wait_empty(api, namespaces, timeout_s, log)
    if left and remove_finalizers:
        log(f"meshplan cleanup: {len(left)} still present after {timeout_s:.0f}s; "
            f"removing meshplan's finalizers: {describe(left)}")
        for it in left:
            meta = it["metadata"]
            keep = finalizers_without_own(meta.get("finalizers") or [])
            if keep != (meta.get("finalizers") or []):
                api.set_finalizers(meta["namespace"], meta["name"], meta["resourceVersion"], keep)
        left = _wait_empty(api, namespaces, FINALIZER_GRACE_S, log)
    if left:
        log(f"meshplan cleanup: FAILED, still present: {describe(left)}. Is the operator running? "
            f"`kubectl describe llmd -n NS NAME` shows what blocks the deletion.")
        return 1
    log("meshplan cleanup: no LLMDeployment left")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    scope.add_argument("-n", "--namespace", action="append", metavar="NS", help="a namespace (repeatable)")
    p.add_argument("--timeout-seconds", type=float, default=300.0,
                   help="how long to wait for the operator to finish the deletions (default 300)")
    p.add_argument("--remove-finalizers-on-timeout", action="store_true",
                   help="after the timeout, remove meshplan's own finalizers from what is left")


def _run(args: argparse.Namespace) -> int:
    namespaces = None if args.all_namespaces else list(dict.fromkeys(args.namespace))
    return cleanup(namespaces, args.timeout_seconds, args.remove_finalizers_on_timeout,
                   log=lambda m: print(m, flush=True))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cleanup", help="delete every LLMDeployment in scope and wait until gone (the chart's pre-delete hook)",
        description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m meshplan.commands.cleanup",
                                description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
