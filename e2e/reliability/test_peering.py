"""Reliability scenario 9: two operator replicas with kopf peering; only one acts; a SIGKILL hands over.

e2e/test_chart.py's test_standby_stays_paused_then_takes_over checks the
chart's primary/standby pair with a graceful stop (SIGTERM: kopf leaves the
peering at once). This test kills the primary with SIGKILL, as a node loss
would: its peering record stays until it expires (kopf's peering lifetime), and
only then may the standby act. Meanwhile the standby must not act at all, also
not through meshplan's own resync loop and child-event queue (which are not
kopf handlers, so kopf's pause does not stop them by itself).
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from e2e import chart_credentials

from . import kit
from .conftest import rel_namespace

pytestmark = [pytest.mark.reliability, pytest.mark.slow]
PEERING = "mprel-peering"


def test_only_the_leader_acts_and_a_killed_leader_hands_over(cluster, rel_fleet, request, full_only):
    kit.ensure_crd(cluster)
    fleet = rel_fleet([kit.h100_group("rel-peer-h", 2)])
    ns = rel_namespace(cluster, request, "mprel-peer")
    # the chart as a user scopes it to one namespace with peering: kopf's peering CRDs and the
    # KopfPeering object from the chart, a Role there with KopfPeering rights
    values = {"watch.allNamespaces": False, "watch.namespaces": [ns], "peering.enabled": True,
              "peering.name": PEERING}
    docs = [d for d in yaml.safe_load_all(chart_credentials.render(
        cluster, ["templates/peering.yaml"], "meshplan-e2e-operator", "rel-peer", values)) if d]
    for kinds in (("CustomResourceDefinition",), ("KopfPeering",)):
        for d in (d for d in docs if d["kind"] in kinds):
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(d))
            if d["kind"] == "CustomResourceDefinition":
                cluster.kubectl("wait", "--for=condition=Established", f"crd/{d['metadata']['name']}",
                                "--timeout=60s")
    creds = kit.operator_kubeconfig(cluster, release="rel-peer", values=values)
    leader = kit.operator(cluster, ns, "--peering", PEERING, "--priority", "100", kubeconfig=creds)
    standby = kit.operator(cluster, ns, "--peering", PEERING, "--priority", "50", kubeconfig=creds)
    try:
        kit.start(leader)
        kit.start(standby)
        m = kit.pinned("peer", fleet.name, kit.H100, tensor=8, replicas=1, max_gpus=16)
        kit.apply(cluster, ns, m)
        kit.available(cluster, ns, "peer")
        # drift and resync periods while both run: the standby must stay idle
        cluster.kubectl("delete", "pod", "peer-r0-0", "-n", ns, "--wait=false")
        kit.available(cluster, ns, "peer")
        time.sleep(3 * leader.resync_s)
        assert kit.reconciles(leader) >= 2
        standby_idle = kit.reconciles(standby)
        assert standby_idle == 0, f"the standby reconciled {standby_idle} times while the leader was alive"
        # nor does it LIST every period and report what its (paused) watches did not see
        standby_log = standby.log_path.read_text(errors="replace")
        assert "not (yet) seen by the watches" not in standby_log, standby_log[-2000:]
        kit.kill9(leader)
        t0 = time.monotonic()
        m["spec"]["replicas"] = 2
        kit.apply(cluster, ns, m)
        obj = kit.wait(lambda: (o := kit.get(cluster, ns, "llmd", "peer")) and o["status"].get("readyReplicas") == 2
                       and o, 150, "the standby scaled to 2 after the leader was killed")
        takeover_s = time.monotonic() - t0
        assert kit.reconciles(standby) >= 1
        pods = kit.pods(cluster, ns)
        assert len(kit.groups(pods, "peer")) == 2 and len(pods) == 2, [p["metadata"]["name"] for p in pods]
        print(f"scenario 9: standby idle ({standby_idle} reconciles) while the leader acted "
              f"({kit.reconciles(leader) if leader.alive() else 'killed'}); took over {takeover_s:.1f}s after SIGKILL")
    finally:
        for o in (leader, standby):
            if o.alive():
                o.stop()
        kit.drop_namespace(cluster, ns)
