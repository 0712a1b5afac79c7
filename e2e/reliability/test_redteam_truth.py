"""Red team, issue 17 part B: the operator stays truthful under hostile input.

The operator runs as the chart's ServiceAccount (kit.operator_kubeconfig); the attacker is the tenant
of e2e/reliability/tenant.py, a ServiceAccount that may only manage LLMDeployments in its namespace,
impersonated through the real API server. Cases: SSRF through the autoscaler's Prometheus (a local
HTTP server on 127.0.0.1 answers with a marker and redirects), spoofed GPU reservations from another
namespace, an edited plan annotation across an operator restart, a child-name collision, and pod
creation refused by PodSecurity `restricted` and by a GPU ResourceQuota. A canary deployment beside
them must stay Available throughout, and the operator's log must hold no traceback.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from . import kit
from .conftest import rel_namespace
from .tenant import as_tenant, make_tenant, tenant_can

pytestmark = [pytest.mark.reliability]
GLOB = "mprel-rtt-*"
MARKER = "MARKER-redteam-3c1e"


class _Server:
    """A loopback HTTP server; `behave(handler)` answers; `hits` counts requests."""

    def __init__(self, behave) -> None:
        self.hits = 0
        me = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                me.hits += 1
                behave(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(h, code: int, body: bytes, headers: dict | None = None) -> None:
    h.send_response(code)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


@pytest.fixture(scope="module")
def servers():
    # where a redirect would lead: a "Prometheus" answering with the marker in a label
    target = _Server(lambda h: _send(h, 200, json.dumps({"status": "success", "data": {"resultType": "vector",
                                      "result": [{"metric": {"leak": MARKER}, "value": [time.time(), MARKER]}]}})
                                      .encode()))
    hostile = _Server(lambda h: _send(h, 302, MARKER.encode(), {"Location": target.url + "/api/v1/query"}))
    yield {"target": target, "hostile": hostile}
    target.close()
    hostile.close()


@pytest.fixture(scope="module")
def op(cluster, request, servers):
    kit.ensure_crd(cluster)
    # the admin allows one endpoint, "hostile" (an allowed host that turned bad); the target is not allowed
    o = kit.start(kit.operator(cluster, GLOB, "--prometheus-endpoint", f"hostile={servers['hostile'].url}"))
    failed = request.session.testsfailed
    yield o
    o.stop()
    if request.session.testsfailed > failed:
        print(f"\n----- operator log (tail) -----\n{o.tail(200)}")


@pytest.fixture(scope="module")
def fleet(cluster):
    f = kit.Fleet(cluster, "rel-rtt", [kit.h100_group("rel-rtt-h", 4)])
    f.add()
    yield f
    f.delete()


@pytest.fixture
def ns(cluster, op, request):
    made = []

    def make(suffix: str = "", labels: dict | None = None) -> str:
        name = rel_namespace(cluster, request, f"mprel-rtt{suffix}")
        for k, v in (labels or {}).items():
            cluster.kubectl("label", "namespace", name, f"{k}={v}", "--overwrite")
        make_tenant(cluster, name)
        made.append(name)
        return name

    yield make
    for name in made:
        kit.drop_namespace(cluster, name)


@pytest.fixture
def canary(cluster, op, fleet, request):
    """An ordinary deployment in its own namespace: must stay Available through every case."""
    name = rel_namespace(cluster, request, "mprel-rtt-canary")
    kit.apply(cluster, name, kit.pinned("canary", fleet.name, kit.H100, tensor=4, replicas=1, max_gpus=4))
    kit.available(cluster, name, "canary", timeout_s=120)

    def check() -> None:
        o = kit.get(cluster, name, "llmd", "canary")
        assert kit.cond(o, "Available").get("status") == "True", (o or {}).get("status")

    yield check
    check()
    kit.drop_namespace(cluster, name)


def _tenant_apply(cluster, ns: str, manifest: dict) -> None:
    r = as_tenant(cluster, ns, "apply", "-f", "-", input=json.dumps(manifest))
    assert r.returncode == 0, r.stderr


def _small(name: str, fleet: kit.Fleet) -> dict:
    return kit.pinned(name, fleet.name, kit.H100, tensor=4, replicas=1, max_gpus=4)


def _log_since(op, start: int) -> str:
    return op.tail(10 ** 7)[start:]


def test_ssrf_is_refused_or_sanitized_and_no_remote_content_reaches_status(cluster, ns, op, fleet, servers, canary):
    tns = ns()
    assert not tenant_can(cluster, tns, "create", "pods"), "premise: the tenant cannot create pods"
    start = len(op.tail(10 ** 7))
    cases = {"any-url": {"prometheusUrl": servers["target"].url},
             "steered-url": {"prometheusUrl": servers["hostile"].url + "/api/v1/query?x=#"},
             "unknown-name": {"prometheus": "target"},
             "allowed-but-hostile": {"prometheus": "hostile"}}
    for name, auto in cases.items():
        m = _small(name, fleet)
        m["spec"]["slo"] = {"ttftMs": 60000, "itlMs": 500, "percentile": 99}
        m["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 1, **auto}
        _tenant_apply(cluster, tns, m)
    t0 = time.monotonic()
    seen = {}
    for name in cases:
        def scaling():
            c = kit.cond(kit.get(cluster, tns, "llmd", name), "ScalingActive")
            return c if c.get("status") == "False" else None
        seen[name] = kit.wait(scaling, 90, f"{name}: ScalingActive=False")
        print(f"redteam SSRF: {name}: {seen[name]['reason']}: {seen[name]['message'][:200]}")
    print(f"redteam SSRF: all four reported within {time.monotonic() - t0:.1f}s")
    for name in ("any-url", "steered-url", "unknown-name"):
        assert seen[name]["reason"] == "PrometheusNotAllowed", seen[name]
    assert seen["allowed-but-hostile"]["reason"] == "MetricsUnavailable"
    assert "redirect refused" in seen["allowed-but-hostile"]["message"]
    time.sleep(5)
    assert servers["target"].hits == 0, "the operator reached a host the admin did not allow"
    for name in cases:
        o = kit.get(cluster, tns, "llmd", name)
        assert MARKER not in json.dumps(o.get("status")), f"{name}: remote content in status"
    assert "Traceback" not in _log_since(op, start)
    canary()


def test_spoofed_reservations_in_another_namespace_do_not_block_a_deployment(cluster, ns, op, fleet, canary):
    """Pods nobody's LLMDeployment owns, with the assigned-node annotation and GPU limits on every node
    (pending forever: their nodeSelector matches nothing), made 'InsufficientCapacity' before."""
    spoof_ns = ns("-spoof")
    tns = ns()
    for i, node in enumerate(fleet.nodes):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"spoof-{i}", "annotations": {"meshplan.dev/assigned-node": node}},
               "spec": {"nodeSelector": {"no-such-label": "x"},
                        "containers": [{"name": "c", "image": "busybox",
                                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
        cluster.kubectl("apply", "-n", spoof_ns, "-f", "-", input=json.dumps(pod))
    _tenant_apply(cluster, tns, _small("victim", fleet))
    t0 = time.monotonic()
    kit.available(cluster, tns, "victim", timeout_s=120)
    print(f"redteam reservations: {len(fleet.nodes)} spoofed 8-GPU reservations ignored; victim Available "
          f"in {time.monotonic() - t0:.1f}s")
    canary()


def test_an_edited_plan_annotation_is_ignored_after_a_restart(cluster, ns, op, fleet, canary):
    tns = ns()
    _tenant_apply(cluster, tns, _small("pinned", fleet))
    before = kit.available(cluster, tns, "pinned", timeout_s=120)
    plan = json.loads(before["metadata"]["annotations"]["meshplan.dev/plan"])
    plan["choice"]["layout"]["tp"] = 8
    plan["reason"] = f"EDITED {MARKER}"
    op.stop()
    start = len(op.tail(10 ** 7))
    r = as_tenant(cluster, tns, "annotate", "llmd", "pinned", "--overwrite",
                  f"meshplan.dev/plan={json.dumps(plan, separators=(',', ':'))}")
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    kit.start(op)

    def ignored():
        evs = [e for e in kit.events(cluster, tns, "pinned") if e["reason"] == "PlanAnnotationIgnored"]
        return evs or None
    evs = kit.wait(ignored, 60, "PlanAnnotationIgnored event")
    print(f"redteam plan annotation: ignored {time.monotonic() - t0:.1f}s after the restart: "
          f"{evs[0]['message'][:200]}")
    o = kit.available(cluster, tns, "pinned", timeout_s=60)
    assert o["status"]["plan"]["tp"] == 4 and MARKER not in json.dumps(o["status"])
    assert json.loads(o["metadata"]["annotations"]["meshplan.dev/plan"])["choice"]["layout"]["tp"] == 4
    for p in kit.pods(cluster, tns):
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("4", 4)
    assert "Traceback" not in _log_since(op, start)
    canary()


def test_a_child_name_collision_is_a_condition_naming_both(cluster, ns, op, fleet, canary):
    tns = ns()
    _tenant_apply(cluster, tns, _small("foo", fleet))
    kit.available(cluster, tns, "foo", timeout_s=120)
    svc = kit.get(cluster, tns, "service", "foo-r0")
    _tenant_apply(cluster, tns, _small("foo-r0", fleet))

    def collided():
        c = kit.cond(kit.get(cluster, tns, "llmd", "foo-r0"), "Placed")
        return c if c.get("reason") == "NameCollision" else None
    c = kit.wait(collided, 60, "foo-r0: Placed=False/NameCollision")
    print(f"redteam names: {c['message'][:220]}")
    assert 'Service "foo-r0"' in c["message"] and "LLMDeployment foo" in c["message"]
    time.sleep(12)        # two resyncs of both: the Service must not flip
    after = kit.get(cluster, tns, "service", "foo-r0")
    assert after["metadata"]["ownerReferences"] == svc["metadata"]["ownerReferences"]
    assert after["spec"]["selector"] == svc["spec"]["selector"]
    assert kit.cond(kit.get(cluster, tns, "llmd", "foo"), "Available").get("status") == "True"
    canary()


def test_podsecurity_and_quota_refusals_are_placed_false_without_traceback_spam(cluster, ns, op, fleet, canary):
    start = len(op.tail(10 ** 7))
    psa = ns("-psa", {"pod-security.kubernetes.io/enforce": "restricted"})
    quota = ns("-quota")
    cluster.kubectl("apply", "-n", quota, "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}))
    kit.wait(lambda: (q := kit.get(cluster, quota, "resourcequota", "gpus")) and q.get("status", {}).get("hard"),
             60, "quota status")
    t0 = time.monotonic()
    _tenant_apply(cluster, psa, _small("psa", fleet))
    _tenant_apply(cluster, quota, _small("quota", fleet))
    got = {}
    for n, name, reason in ((psa, "psa", "PodSecurityRefused"), (quota, "quota", "QuotaExceeded")):
        def placed():
            c = kit.cond(kit.get(cluster, n, "llmd", name), "Placed")
            return c if c.get("reason") == reason else None
        got[name] = kit.wait(placed, 60, f"{name}: Placed=False/{reason}")
        got[name]["after_s"] = time.monotonic() - t0
        print(f"redteam refusals: {name}: {reason} after {got[name]['after_s']:.1f}s: {got[name]['message'][:240]}")
    assert "violates PodSecurity" in got["psa"]["message"]
    assert "exceeded quota" in got["quota"]["message"] and "requests.nvidia.com/gpu" in got["quota"]["message"]
    time.sleep(30)        # several resyncs (5 s) and back-off retries
    log = _log_since(op, start)
    lines = {r: sum(1 for line in log.splitlines() if r in line and "WARNING" in line)
             for r in ("violates PodSecurity", "exceeded quota")}
    print(f"redteam refusals: 30 s later: {log.count('Traceback')} tracebacks, warning lines {lines}")
    assert log.count("Traceback") == 0, log[-3000:]
    assert all(v <= 2 for v in lines.values()), lines
    assert not kit.pods(cluster, psa)
    canary()


def test_namespace_deletion_under_a_serving_deployment_is_quiet_and_complete(cluster, ns, op, fleet, canary):
    """Fault case: the namespace of a serving deployment is deleted. While the namespace terminates every
    create is refused (403 NamespaceTerminating); the operator must let the LLMDeployment go (its finalizer)
    with no traceback per object every resync, and the canary elsewhere keeps serving."""
    victim = ns("-nsdel")
    _tenant_apply(cluster, victim, _small("doomed", fleet))
    kit.available(cluster, victim, "doomed", timeout_s=120)
    start = len(op.tail(10 ** 7))
    t0 = time.monotonic()
    cluster.kubectl("delete", "namespace", victim, "--wait=false")
    kit.wait(lambda: kit.get(cluster, victim, "llmd", "doomed") is None, 120, "LLMDeployment gone")
    gone_llmd = time.monotonic() - t0
    kit.wait(lambda: cluster.kubectl("get", "namespace", victim, check=False).returncode != 0, 180, "namespace gone")
    gone_ns = time.monotonic() - t0
    time.sleep(15)        # resyncs (5 s) after the namespace went
    log = _log_since(op, start)
    errors = [line for line in log.splitlines() if "ERROR" in line]
    print(f"redteam namespace deletion: LLMDeployment gone after {gone_llmd:.1f}s, namespace gone after "
          f"{gone_ns:.1f}s; {log.count('Traceback')} tracebacks, {len(errors)} ERROR lines")
    assert log.count("Traceback") == 0, log[-3000:]
    assert len(errors) <= 2, errors[-5:]
    canary()
