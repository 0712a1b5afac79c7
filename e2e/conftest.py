"""Session fixture: one real local control plane for the whole e2e suite.

Starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and
Prometheus (see meshplan.devcluster) with every built-in fleet, once per pytest
session, in a private state directory, and stops it at the end. Set
MESHPLAN_E2E_REUSE=1 to reuse a cluster already started with
`meshplan dev-cluster up --fleet all` (faster iteration while developing).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from meshplan.devcluster import Cluster
from meshplan.devcluster.fleets import fleet_names

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).is_relative_to(REPO / "e2e"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster():
    if os.environ.get("MESHPLAN_E2E_REUSE"):
        c = Cluster()
        if not c.running():
            pytest.fail("MESHPLAN_E2E_REUSE is set but no dev cluster runs: meshplan dev-cluster up --fleet all")
        yield c
        return
    state = Path(tempfile.mkdtemp(prefix="meshplan-e2e-"))
    c = Cluster(state_dir=state, log=lambda m: print(f"[e2e] {m}"))
    c.up(fleet_names(), prometheus=True, timeout=240)
    try:
        yield c
    finally:
        c.down(quiet=True)


@pytest.fixture
def namespace(cluster, request):
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    name = "t-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:50].strip("-")
    import hashlib
    # the pid keeps names unique across runs on a reused cluster (a namespace takes a while to go)
    name = f"{name[:52]}-{hashlib.sha1((request.node.nodeid + str(os.getpid())).encode()).hexdigest()[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster, tmp_path_factory):
    """Credentials for e2e operators: the Helm chart's ServiceAccount (its RBAC, nothing more).

    A right missing from charts/meshplan/templates/rbac.yaml therefore fails the
    e2e suite instead of surfacing in users' clusters (issue 7). Set
    MESHPLAN_E2E_OPERATOR_ADMIN=1 to run operators as cluster-admin while debugging.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location("chart_credentials", Path(__file__).with_name("chart_credentials.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.operator_kubeconfig(cluster, tmp_path_factory.mktemp("operator-sa") / "sa.kubeconfig"))
