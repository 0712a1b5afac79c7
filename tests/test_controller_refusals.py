"""Issue 17, finding 7: a create the API server refuses (403) becomes Placed=False with its reason.

The API server is a fake here (nothing else can run in tests/: the e2e suite,
e2e/reliability/test_redteam_truth.py, checks the same against a real API server with
PodSecurity and ResourceQuota admission). Its 403 messages are the real API server's text
(k8s.io/pod-security-admission: `violates PodSecurity "restricted:latest": ...`;
plugin/pkg/admission/resourcequota: `exceeded quota: ...`; namespace lifecycle admission:
`unable to create new content in namespace X because it is being terminated`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from datetime import datetime, timezone

import pytest
import yaml

from meshplan.controller.handlers import ErrorLog
from meshplan.controller.kube import ApiError
from meshplan.controller.reconcile import REFUSAL_BACKOFF_S, Reconciler, World, classify_refusal
from meshplan.devcluster.fleets import fleet_nodes, load_fleet
from meshplan.topology import node_info

PSA = ('pods "llama-r0-0" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
       '(container "engine" must set securityContext.allowPrivilegeEscalation=false), runAsNonRoot != true')
QUOTA = ('pods "llama-r0-0" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, '
         'used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4')
TERMINATING = ('pods "llama-r0-0" is forbidden: unable to create new content in namespace ns because it is '
               'being terminated')


class FakeApiServer:
    """The calls the reconciler makes, on dicts; pod creation refused with `refuse` while it is set."""

    def __init__(self, body: dict) -> None:
        self.body = body
        self.bodies = {body["metadata"]["name"]: body}
        self.objects: dict[tuple[str, str], dict] = {}
        self.refuse: tuple[int, str] | None = None
        self.events: list[dict] = []
        self.pod_attempts = 0

    async def get(self, api_version, kind, namespace, name):
        if kind == "LLMDeployment":
            return copy.deepcopy(self.bodies[name])
        o = self.objects.get((kind, name))
        return copy.deepcopy(o) if o is not None else None

    async def list(self, api_version, kind, namespace, selector=None):
        key, _, value = (selector or "=").partition("=")
        return [copy.deepcopy(o) for (k, _), o in self.objects.items()
                if k == kind and (not selector or (o["metadata"].get("labels") or {}).get(key) == value)]

    async def crd_exists(self, name):
        return False

    async def apply(self, obj, field_manager, force):
        if obj["kind"] == "Pod":
            self.pod_attempts += 1
            if self.refuse is not None:
                raise ApiError(self.refuse[0], "Forbidden", self.refuse[1])
        o = copy.deepcopy(obj)
        o["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
        self.objects[(obj["kind"], obj["metadata"]["name"])] = o
        return o

    async def delete(self, api_version, kind, namespace, name, uid=None, grace_period_s=None):
        return self.objects.pop((kind, name), None) is not None

    async def patch_status(self, api_version, kind, namespace, name, status, resource_version=None):
        self.bodies[name].setdefault("status", {}).update(copy.deepcopy(status))
        return self.bodies[name]

    async def request(self, method, path, **kw):
        if path.endswith("/events"):
            self.events.append(kw.get("body"))
        elif method == "PATCH":
            name = path.rsplit("/", 1)[-1]
            self.bodies[name]["metadata"].setdefault("annotations", {}).update(kw["body"]["metadata"]["annotations"])
        return {}


def _manifest(name: str = "llama", uid: str = "u-1") -> dict:
    m = yaml.safe_load(open("examples/llama-3.1-70b-hgx-h100.yaml"))
    m["metadata"].update(name=name, namespace="ns", uid=uid, generation=1)
    m["spec"].pop("slo")
    m["spec"]["autoscaling"] = {"enabled": False}
    m["spec"]["replicas"] = 1
    m["spec"]["parallelism"]["tensor"] = 8
    return m


def _setup():
    m = _manifest()
    infos = [node_info(n, ready_if_unknown=True) for n in fleet_nodes(load_fleet("hgx-h100"))]
    api = FakeApiServer(m)
    now = [1000.0]
    rec = Reconciler(kube=api, world=World(nodes=lambda: infos), monotonic=lambda: now[0],
                     clock=lambda: datetime(2026, 1, 1, tzinfo=timezone.utc))
    return api, rec, now


def _placed(api):
    return next(c for c in api.body["status"]["conditions"] if c["type"] == "Placed")


@pytest.mark.parametrize("message, reason", [(PSA, "PodSecurityRefused"), (QUOTA, "QuotaExceeded"),
                                             (TERMINATING, "NamespaceTerminating")])
def test_a_refused_create_is_placed_false_with_the_api_servers_reason_and_backs_off(message, reason, caplog):
    api, rec, now = _setup()
    api.refuse = (403, message)
    caplog.set_level(logging.DEBUG, logger="meshplan.controller")
    res = asyncio.run(rec.reconcile("ns", "llama"))          # must not raise (that was a traceback per 5 s)
    placed = _placed(api)
    assert (placed["status"], placed["reason"]) == ("False", reason)
    assert message in placed["message"] and "HTTP 403" in placed["message"]
    assert res.requeue_after_s == pytest.approx(REFUSAL_BACKOFF_S[0])
    assert [e["reason"] for e in api.events if e["type"] == "Warning"] == [reason]
    assert not any(e["reason"] == "ReplicaCreated" for e in api.events)
    attempts = api.pod_attempts
    # within the back-off: nothing is tried again
    asyncio.run(rec.reconcile("ns", "llama"))
    assert api.pod_attempts == attempts
    # after it: tried again, the delay grows, no new warning line and no new event
    for i in range(1, 4):
        now[0] += REFUSAL_BACKOFF_S[i - 1] + 0.1
        res = asyncio.run(rec.reconcile("ns", "llama"))
        assert res.requeue_after_s == pytest.approx(REFUSAL_BACKOFF_S[i])
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and not any(r.exc_info for r in caplog.records)
    assert [e["reason"] for e in api.events if e["type"] == "Warning"] == [reason]
    # the namespace's admin fixes it: created, released, Placed=True, one line that it recovered
    api.refuse = None
    now[0] += 1000
    asyncio.run(rec.reconcile("ns", "llama"))
    assert _placed(api)["status"] == "True"
    pods = [o for (k, _), o in api.objects.items() if k == "Pod"]
    assert pods and all(not p["spec"].get("schedulingGates") for p in pods)
    assert any("accepts the writes again" in r.getMessage() for r in caplog.records)


def test_refusals_are_classified_by_the_api_servers_text():
    assert classify_refusal(403, PSA)[0] == "PodSecurityRefused"
    assert classify_refusal(403, QUOTA)[0] == "QuotaExceeded"
    assert classify_refusal(403, TERMINATING)[0] == "NamespaceTerminating"
    assert classify_refusal(403, 'pods is forbidden: User "x" cannot create resource "pods"')[0] == "CreateForbidden"
    assert classify_refusal(503, "the server is currently unable to handle the request") is None
    assert classify_refusal(500, "etcdserver: request timed out") is None


def test_an_outage_is_one_line_per_change_with_growing_delays(caplog):
    log = ErrorLog()
    caplog.set_level(logging.DEBUG, logger="meshplan.controller")
    key = ("ns", "llama")
    delays = [log.failed(key, ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 6443)"))
              for _ in range(6)]
    assert delays == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    delays.append(log.failed(key, ApiError(503, "ServiceUnavailable", "etcd is down")))   # another failure
    assert delays[-1] == 5.0
    log.succeeded(key)
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.levelname for r in lines] == ["WARNING", "WARNING", "INFO"]
    assert not any(r.exc_info for r in caplog.records), "an expected failure logs no traceback"


def _placed_of(api, name):
    return next(c for c in api.bodies[name]["status"]["conditions"] if c["type"] == "Placed")


def test_a_child_name_taken_by_another_deployment_is_never_adopted():
    """Issue 17, finding 6: deployments `foo` and `foo-r0` both claimed Service `foo-r0` (foo's replica 0
    headless Service, foo-r0's client Service); owner and selector flipped at every resync."""
    api, rec, now = _setup()
    api.bodies.clear()
    api.bodies["foo"] = _manifest("foo", "uid-foo")
    api.bodies["foo-r0"] = _manifest("foo-r0", "uid-foo-r0")
    asyncio.run(rec.reconcile("ns", "foo"))
    svc = api.objects[("Service", "foo-r0")]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-foo"
    selector = copy.deepcopy(svc["spec"]["selector"])
    for _ in range(3):                       # resyncs of both
        asyncio.run(rec.reconcile("ns", "foo-r0"))
        now[0] += 400
        asyncio.run(rec.reconcile("ns", "foo"))
    svc = api.objects[("Service", "foo-r0")]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-foo" and svc["spec"]["selector"] == selector
    placed = _placed_of(api, "foo-r0")
    assert (placed["status"], placed["reason"]) == ("False", "NameCollision"), placed
    assert 'Service "foo-r0" already exists, owned by LLMDeployment foo' in placed["message"]
    assert "foo-r0" in placed["message"]
    assert _placed_of(api, "foo")["status"] == "True"
    # foo-r0 created nothing that could serve under a taken name
    assert not [o for (k, _), o in api.objects.items()
                if k == "Pod" and o["metadata"]["labels"].get("meshplan.dev/deployment") == "foo-r0"]
