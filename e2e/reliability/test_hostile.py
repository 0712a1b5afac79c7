"""Reliability scenario 11: hostile input is refused with a clear error and the operator keeps serving.

Two lines of defence, both checked here: the API server (the CRD's schema,
patterns and CEL rules, so `kubectl apply` fails and names the field) and the
operator (a spec the schema admits but that cannot be run is reported in
`Planned=False` with a message naming the field and the fix; no pods, no
crash, no hot loop). After every hostile object is in place, a normal
deployment in the same namespace must still become Available.

The table of ordinary invalid specs lives in tests/test_api_invalid.py (fed to
the CRD by e2e/test_api_validation.py); this module adds injection, size,
naming and magnitude attacks.
"""

from __future__ import annotations

import copy
import json
import time

import pytest

from . import kit
from .conftest import rel_namespace

pytestmark = [pytest.mark.reliability]
GLOB = "mprel-hst-*"


@pytest.fixture(scope="module")
def op(cluster, request):
    yield from kit.serve_module(cluster, request, GLOB, log_lines=150)


@pytest.fixture(scope="module")
def fleet(cluster):
    f = kit.Fleet(cluster, "rel-hst", [kit.h100_group("rel-hst-h", 2)])
    f.add()
    yield f
    f.delete()


@pytest.fixture
def ns(cluster, op, request):
    name = rel_namespace(cluster, request, "mprel-hst")
    yield name
    kit.drop_namespace(cluster, name)
    kit.wait(lambda: not kit.pods(cluster, name), 90, f"pods of {name} gone")


def base(name: str, fleet: kit.Fleet) -> dict:
    return kit.pinned(name, fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=8)


def refused(cluster, ns: str, manifest: dict) -> str:
    r = cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest), check=False)
    assert r.returncode != 0, f"accepted: {json.dumps(manifest)[:300]}"
    return r.stderr


def _with(m: dict, path: str, value) -> dict:
    m = copy.deepcopy(m)
    *head, last = path.split(".")
    cur = m
    for k in head:
        cur = cur.setdefault(k, {})
    cur[last] = value
    return m


# (case id, path, value, text the API server's error must contain)
API_REFUSES = [
    ("unicode-name", "metadata.name", "llm-ünïcode", "RFC 1123"),
    ("name-too-long", "metadata.name", "a" * 254, "253"),
    ("promql-injection-metric", "spec.autoscaling.metrics",
     {"ttftHistogram": 'vllm:ttft_bucket{model_name="x"} or vector(1) #'}, "spec.autoscaling.metrics.ttftHistogram"),
    ("promql-injection-served-name", "spec.model.servedName", 'x"} or vector(1) #', "spec.model.servedName"),
    ("nccl-env-newline", "spec.nccl.socketIfname", "eth0\nNCCL_DEBUG=TRACE", "spec.nccl.socketIfname"),
    ("negative-replicas", "spec.replicas", -1, "spec.replicas"),
    ("huge-replicas", "spec.replicas", 10 ** 20, "spec.replicas"),
    ("huge-max-gpus", "spec.gpus.maxGpus", 2 ** 40, "spec.gpus.maxGpus"),
    ("nan-rate", "spec.workload", {"requestRate": "NaN"}, "spec.workload.requestRate"),
    ("one-mib-unknown-field", "spec.junk", "x" * (1 << 20), "junk"),
    ("one-mib-annotation", "metadata.annotations", {"big": "x" * (1 << 20)}, "annotations"),
]


@pytest.mark.parametrize("case,path,value,text", API_REFUSES, ids=[c[0] for c in API_REFUSES])
def test_api_server_refuses_hostile_manifest_naming_the_field(cluster, ns, fleet, case, path, value, text):
    err = refused(cluster, ns, _with(base("h", fleet), path, value))
    assert text in err, err[:2000]


# names and magnitudes the schema admits: the operator must report them, not loop or crash
OPERATOR_REPORTS = [
    # a Service name must be a DNS-1035 label (<= 63 chars, starts with a letter, no dots)
    ("dotted-name", {"metadata.name": "llm.v1"}),
    ("digit-first-name", {"metadata.name": "1llm"}),
    ("max-length-name", {"metadata.name": ("a" * 62 + ".") * 4 + "a"}),
    ("long-label-name", {"metadata.name": "b" * 64}),
    ("absurd-replicas", {"spec.replicas": 8000, "spec.gpus.maxGpus": 65536}),
    # label selector syntax inside a nodeSelector value / key: must not widen or break the selection
    ("label-injection-selector-value", {"spec.gpus.nodeSelector": {"meshplan.dev/fleet": "x,kubernetes.io/os!=y"}}),
    ("label-injection-selector-key", {"spec.gpus.nodeSelector": {"a b=c,d": "x"}}),
    ("absurd-model", {"spec.model": {"name": "absurd", "architecture": {
        "layers": 1024, "hiddenSize": 262144, "attentionHeads": 1024, "kvHeads": 1024, "headDim": 4096,
        "intermediateSize": 1048576, "experts": 4096, "expertsPerToken": 256, "moeIntermediateSize": 1048576,
        "vocabSize": 4194304, "maxContextTokens": 16777216, "totalParams": 100000000000000}},
        "spec.parallelism": {"tensor": "auto", "pipeline": "auto"}}),
]


def test_admitted_but_unrunnable_specs_are_reported_and_others_still_served(cluster, ns, op, fleet):
    log_start = len(op.tail(10 ** 7))
    names = []
    for case, changes in OPERATOR_REPORTS:
        m = base(case, fleet)
        for path, value in changes.items():
            m = _with(m, path, value)
        r = cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(m), check=False)
        if r.returncode != 0:
            print(f"scenario 11: {case}: refused by the API server: {r.stderr.strip()[:200]}")
            continue
        names.append((case, m["metadata"]["name"]))
    t0 = time.monotonic()
    results = {}
    for case, name in names:
        def reported():
            o = kit.get(cluster, ns, "llmd", name)
            if not o or o.get("status", {}).get("observedGeneration") != o["metadata"]["generation"]:
                return None
            if kit.cond(o, "Available").get("status") == "True":
                return ("Available", "")
            p = kit.cond(o, "Planned")
            return (p.get("reason"), p.get("message", "")) if p.get("status") == "False" else None
        try:
            results[case] = kit.wait(reported, 90, f"{case} reported")
        except AssertionError:
            o = kit.get(cluster, ns, "llmd", name)
            results[case] = ("NOT REPORTED", json.dumps((o or {}).get("status"))[:400])
    report_s = time.monotonic() - t0
    for case, (reason, msg) in results.items():
        print(f"scenario 11: {case}: {reason}: {msg[:220]}")
    assert op.alive(), op.tail(50)
    # the operator keeps serving the others
    ok = base("fine", fleet)
    kit.apply(cluster, ns, ok)
    t1 = time.monotonic()
    kit.available(cluster, ns, "fine", timeout_s=90)
    print(f"scenario 11: all hostile objects reported in {report_s:.1f}s; a normal one Available "
          f"{time.monotonic() - t1:.1f}s after apply")
    bad = {c: r for c, r in results.items() if r[0] == "NOT REPORTED"}
    assert not bad, bad
    unclear = {c: r for c, r in results.items()
               if r[0] not in ("Available", "InvalidSpec", "InsufficientCapacity", "NoFeasiblePlan")}
    assert not unclear, unclear
    # names that cannot become Service names or label values are refused naming metadata.name
    # ("1llm" is a valid Service name since Kubernetes 1.34's RelaxedServiceNameValidation)
    for case in ("dotted-name", "max-length-name", "long-label-name"):
        if case in results:
            assert results[case][0] == "InvalidSpec" and "metadata.name" in results[case][1], results[case]
    for case in ("label-injection-selector-value", "label-injection-selector-key"):
        if case in results:
            assert results[case][0] == "InvalidSpec" and "spec.gpus.nodeSelector" in results[case][1], results[case]
    assert op.tail(10 ** 7)[log_start:].count("Traceback") == 0, op.tail(200)


def _big(fleet: kit.Fleet) -> dict:
    """A ~600 KB manifest the schema admits: 64 engine env vars and 64 NCCL vars of 4 KiB, 64 args of 1 KiB."""
    big = base("big", fleet)
    big["spec"]["engine"]["env"] = [{"name": f"BIG_{i}", "value": "v" * 4096} for i in range(64)]
    big["spec"].setdefault("nccl", {})["env"] = [{"name": f"NCCL_BIG_{i}", "value": "n" * 4096} for i in range(64)]
    # a real vLLM option (unknown flags are refused before rendering: api.extra_args), repeated: argparse keeps the last
    big["spec"]["engine"]["extraArgs"] = [f"--chat-template={'a' * 1000}" for i in range(64)]
    return big


def test_huge_admitted_manifest_is_reported(cluster, ns, op, fleet):
    """The rendered pods would exceed the API server's 256 KiB annotation limit: InvalidSpec with the
    API server's words, no pods, others still served."""
    big = _big(fleet)
    # create, not apply: apply's last-applied annotation alone would exceed the 256 KiB annotation limit
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(big))
    o = kit.wait(lambda: (o := kit.get(cluster, ns, "llmd", "big")) and kit.cond(o, "Planned").get("status") == "False"
                 and o, 90, "big reported")
    planned = kit.cond(o, "Planned")
    assert planned["reason"] == "InvalidSpec" and "262144 bytes" in planned["message"], planned
    assert not kit.pods(cluster, ns)
    kit.apply(cluster, ns, base("fine", fleet))
    kit.available(cluster, ns, "fine", timeout_s=90)
    print(f"scenario 11: {len(json.dumps(big))}-byte manifest: {planned['reason']}: {planned['message'][:200]}")


def test_huge_admitted_manifest_causes_no_error_loop(cluster, ns, op, fleet):
    """F7: kopf's diff base of such a spec is a digest (controller/settings.py), not a copy of the spec
    that the API server refuses (422, annotations over 256 KiB) and kopf retried forever."""
    log_start = len(op.tail(10 ** 7))
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(_big(fleet)))
    kit.wait(lambda: (o := kit.get(cluster, ns, "llmd", "big")) and kit.cond(o, "Planned").get("reason"),
             90, "big reported")
    time.sleep(15)
    log = op.tail(10 ** 7)[log_start:]
    assert log.count("Traceback") == 0, log[-3000:]
    # the refused create is tried once per generation, not again at every resync (5 s here)
    refusals = [line for line in log.splitlines() if "WARNING" in line and "the API server refuses" in line]
    assert len(refusals) == 1, refusals
    kopf_trouble = [line for line in log.splitlines() if line.startswith("[") and "] kopf." in line
                    and ("[ERROR" in line or "[WARNING" in line or "Throttling" in line)]
    assert not kopf_trouble, kopf_trouble[:5]
    annotations = kit.get(cluster, ns, "llmd", "big")["metadata"].get("annotations") or {}
    assert annotations.get("meshplan.dev/last-handled-digest", "").startswith("sha256:"), annotations
    assert len(annotations["meshplan.dev/last-handled-digest"]) < 100
    assert "meshplan.dev/last-handled-configuration" not in annotations
    assert sum(len(k) + len(v) for k, v in annotations.items()) < 16 * 1024, {k: len(v) for k, v in annotations.items()}
