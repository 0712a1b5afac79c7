"""Reliability scenario 5: concurrent writers on the LLMDeployment, its status and its children.

What can make meshplan's writes conflict (409) and how it avoids or retries
them (controller/apply.py, reconcile.py): children are written with
server-side apply and `force=true` (a field another manager took is taken
back, not refused), status is a merge patch of the keys meshplan owns without
a resourceVersion precondition (kopf's own annotation writes would otherwise
conflict with every patch), and a 409 that still happens becomes
`kopf.TemporaryError` retried after 1 s. This test runs three writers that
keep changing the object while a scale-up is in progress and asserts: the
scale-up completes promptly, the other writers' data survives (nothing of
theirs dropped or clobbered), and meshplan's own fields win on its children.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from . import kit
from .conftest import rel_namespace

pytestmark = [pytest.mark.reliability]
GLOB = "mprel-cfl-*"


@pytest.fixture(scope="module")
def op(cluster, request):
    yield from kit.serve_module(cluster, request, GLOB)


@pytest.fixture
def ns(cluster, op, request):
    name = rel_namespace(cluster, request, "mprel-cfl")
    yield name
    kit.drop_namespace(cluster, name)
    kit.wait(lambda: not kit.pods(cluster, name), 90, f"pods of {name} gone")


def test_concurrent_writers_do_not_drop_or_delay_anything(cluster, ns, op, rel_fleet):
    from kubernetes import client

    fleet = rel_fleet([kit.h100_group("rel-cfl-h", 4)])
    api = cluster.api_client()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    m = kit.pinned("busy", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=32)
    kit.apply(cluster, ns, m)
    kit.available(cluster, ns, "busy")
    stop = threading.Event()
    counts = {"meta": 0, "status": 0, "child": 0, "errors": 0}

    def meta_writer():        # another controller annotating the parent (bumps resourceVersion)
        while not stop.is_set():
            try:
                custom.patch_namespaced_custom_object("meshplan.dev", "v1alpha1", ns, "llmdeployments", "busy",
                                                      {"metadata": {"annotations": {"other/tick": str(counts["meta"])}}})
                counts["meta"] += 1
            except Exception:   # noqa: BLE001
                counts["errors"] += 1
            time.sleep(0.05)

    def status_writer():      # a co-owner of status (the autoscaler's key), no resourceVersion
        while not stop.is_set():
            try:
                custom.patch_namespaced_custom_object_status(
                    "meshplan.dev", "v1alpha1", ns, "llmdeployments", "busy",
                    {"status": {"autoscaling": {"reason": f"WriterTick{counts['status']}"}}})
                counts["status"] += 1
            except Exception:   # noqa: BLE001
                counts["errors"] += 1
            time.sleep(0.1)

    def child_writer():       # another manager labelling the children and fighting over one label
        while not stop.is_set():
            for p in core.list_namespaced_pod(ns).items:
                try:
                    core.patch_namespaced_pod(p.metadata.name, ns, {"metadata": {"labels": {
                        "other/tick": str(counts["child"] % 1000), "meshplan.dev/role": "hijacked"}}})
                    counts["child"] += 1
                except Exception:   # noqa: BLE001
                    counts["errors"] += 1
            time.sleep(0.2)

    threads = [threading.Thread(target=f, daemon=True) for f in (meta_writer, status_writer, child_writer)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
        t0 = time.monotonic()
        custom.patch_namespaced_custom_object("meshplan.dev", "v1alpha1", ns, "llmdeployments", "busy",
                                              {"spec": {"replicas": 3}})
        obj = kit.wait(lambda: (o := kit.get(cluster, ns, "llmd", "busy")) and o["status"].get("readyReplicas") == 3
                       and o["status"].get("observedGeneration") == o["metadata"]["generation"] and o, 60,
                       "scale-up to 3 under concurrent writers")
        scaled_s = time.monotonic() - t0
        time.sleep(3)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    # the co-writers' data survived meshplan's status and child writes
    obj = kit.get(cluster, ns, "llmd", "busy")
    assert obj["status"]["autoscaling"]["reason"].startswith("WriterTick"), obj["status"].get("autoscaling")
    assert obj["metadata"]["annotations"]["other/tick"]
    # meshplan's own label wins back on every pod (server-side apply with force) once the writer stops
    kit.wait(lambda: all(p["metadata"]["labels"]["meshplan.dev/role"] in ("leader", "worker")
                         for p in kit.pods(cluster, ns)), 30, "meshplan.dev/role restored on every pod")
    assert all(p["metadata"]["labels"].get("other/tick") for p in kit.pods(cluster, ns))
    kit.available(cluster, ns, "busy")
    log = op.tail(100000)
    conflicts = log.count("409") + log.count("onflict")
    tracebacks = log.count("Traceback")
    print(f"scenario 5: writes by others meta={counts['meta']} status={counts['status']} child={counts['child']} "
          f"(errors {counts['errors']}); scale 1->3 ready in {scaled_s:.1f}s; operator log: {conflicts} "
          f"conflict line(s), {tracebacks} traceback(s)")
    assert scaled_s < 30
    assert tracebacks == 0, log[-3000:]
