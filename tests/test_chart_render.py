"""The Helm chart, rendered by a real helm (built from Go modules by e2e/build-control-plane.sh).

What must hold whatever the values: `helm lint` passes; RBAC has no wildcard and
no versioned API group and grants exactly the rights the issue lists; every pod
the chart creates (operator and pre-delete hook) passes the `restricted` Pod
Security Standard; the operator and the hook get the same scope arguments;
values.yaml, values.schema.json and the templates agree.

The expected RBAC below is written from the issue (#7) and the operator's needs,
not read back from the templates.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from meshplan.devcluster.cluster import ClusterError, Cluster

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "meshplan"
KUBE_VERSION = "1.36.3"  # a go-built helm defaults to an old kube version (cluster-harness.md)


def _helm() -> str:
    try:
        return Cluster().binary("helm")
    except ClusterError as exc:
        pytest.skip(f"helm binary missing ({exc}); CI builds it with e2e/build-control-plane.sh")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _set_args(values: dict | None) -> list[str]:
    return [a for k, v in (values or {}).items() for a in ("--set-json", f"{k}={json.dumps(v)}")]


def render(values: dict | None = None, namespace: str = "meshplan-system") -> list[dict]:
    out = helm("template", "rel", str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION,
               *_set_args(values)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render_error(values: dict) -> str:
    proc = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, *_set_args(values), check=False)
    assert proc.returncode != 0, f"helm accepted values it should refuse: {values}"
    return proc.stderr


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(docs: list[dict], kind: str) -> dict:
    return one(docs, kind)["spec"]["template"]["spec"]["containers"][0]


def rules_as_set(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def grants(group: str, resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources for v in verbs}


READ = ["get", "list", "watch"]
WRITE_CHILD = READ + ["create", "patch", "update", "delete"]

# From issue #7 and the brief: what the operator needs, cluster-scoped and per watched namespace.
EXPECTED_CLUSTER = (grants("", ["nodes"], READ)
                    | grants("apiextensions.k8s.io", ["customresourcedefinitions"], READ)
                    | grants("", ["namespaces"], ["list", "watch"]))
EXPECTED_WORKLOADS = (grants("meshplan.dev", ["llmdeployments"], READ + ["patch", "update"])
                      | grants("meshplan.dev", ["llmdeployments/status"], ["get", "patch", "update"])
                      | grants("meshplan.dev", ["llmdeployments/finalizers"], ["update"])
                      | grants("", ["pods", "services"], WRITE_CHILD)
                      | grants("", ["events"], ["create", "patch"])
                      # TensorRT-LLM multi-node: the deployment's ssh Secret (never listed or watched)
                      | grants("", ["secrets"], ["get", "create", "patch"])
                      # disaggregated deployments (issue 19): the InferencePool, its endpoint picker and the
                      # picker's RBAC (whose read rights on pods and inferencepools the operator must hold)
                      | grants("inference.networking.k8s.io", ["inferencepools"], READ + ["create", "patch", "delete"])
                      | grants("apps", ["deployments"], ["get", "create", "patch", "delete"])
                      | grants("", ["serviceaccounts"], ["get", "create", "patch", "delete"])
                      | grants("rbac.authorization.k8s.io", ["roles", "rolebindings"], ["get", "create", "patch", "delete"]))
PEERING_VERBS = READ + ["patch"]
# a namespace-scoped operator lists GPU pods of every namespace (free GPUs are shared)
FOREIGN_PODS = grants("", ["pods"], ["list"])


# ---- lint and metadata ----------------------------------------------------------------------

@pytest.mark.parametrize("values", [
    {},
    {"watch": {"allNamespaces": False, "namespaces": ["team-a", "team-b"]}},
    {"peering": {"enabled": True, "name": "meshplan", "createCRDs": True, "standby": {"enabled": True}}},
    {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}, "computeDomains": {"enabled": True},
     "engineMetrics": {"podMonitor": {"enabled": True}}, "prometheusUrl": "http://prometheus:9090"},
], ids=["defaults", "namespaced", "peering-standby", "servicemonitor-computedomains"])
def test_helm_lint_passes(values, tmp_path):
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    out = helm("lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, "-f", str(f))
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_app_version_matches_pyproject():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == project["version"]
    image = container(render(), "Deployment")["image"]
    assert image.endswith(f":{project['version']}")


def test_crds_are_shipped_in_the_chart():
    crd = yaml.safe_load((CHART / "crds" / "meshplan.dev_llmdeployments.yaml").read_text())
    assert crd["spec"]["group"] == "meshplan.dev"
    assert crd["spec"]["names"]["plural"] == "llmdeployments"


# ---- the operator Deployment ----------------------------------------------------------------

def test_default_deployment_one_replica_recreate_cluster_wide_standalone():
    docs = render()
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    c = container(docs, "Deployment")
    assert "command" not in c, "the image ENTRYPOINT (meshplan) must stay in charge"
    assert c["args"][:3] == ["run", "--all-namespaces", "--standalone"]
    liveness_url = c["args"][c["args"].index("--liveness") + 1]
    port = int(re.search(r":(\d+)/", liveness_url).group(1))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["health"] == port
    assert c["livenessProbe"]["httpGet"] == {"path": urlpath(liveness_url), "port": "health"}
    assert c["readinessProbe"]["httpGet"]["port"] == "health"
    assert c["args"][c["args"].index("--metrics-port") + 1] == str(ports["metrics"])
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]


def urlpath(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def test_prometheus_url_reaches_the_operator_only_when_set():
    env = {e["name"]: e.get("value") for e in container(render(), "Deployment")["env"]}
    assert "MESHPLAN_PROMETHEUS_URL" not in env
    url = "http://prometheus.monitoring:9090"
    env = {e["name"]: e.get("value") for e in container(render({"prometheusUrl": url}), "Deployment")["env"]}
    assert env["MESHPLAN_PROMETHEUS_URL"] == url


def test_network_values_reach_the_operator_as_it_reads_them():
    from meshplan.topology import DEFAULT_RDMA_RESOURCES, network_config_from_env

    env = {e["name"]: e.get("value") for e in container(render(), "Deployment")["env"]}
    assert "MESHPLAN_NETWORK_BLOCK_LABEL" not in env
    assert network_config_from_env(env).rdma_resources == DEFAULT_RDMA_RESOURCES   # chart default == code default
    env = {e["name"]: e.get("value") for e in container(render({
        "network": {"blockLabel": "cloud.google.com/gce-topology-block",
                    "rdmaResources": ["rdma/rdma_shared_device_a=roce"]}}), "Deployment")["env"]}
    cfg = network_config_from_env(env)
    assert cfg.label == "cloud.google.com/gce-topology-block"
    assert cfg.rdma_resources == (("rdma/rdma_shared_device_a", "roce"),)
    assert "rdmaResources" in render_error({"network": {"rdmaResources": ["rdma/ib=omnipath"]}})
    env = {e["name"]: e.get("value") for e in container(render({
        "network": {"multusNetworks": ["net-a", "infra/net-b"]}}), "Deployment")["env"]}
    assert network_config_from_env(env).multus_networks == ("net-a", "infra/net-b")


def test_namespaced_watch_args_and_roles():
    docs = render({"watch": {"allNamespaces": False, "namespaces": ["team-a", "team-b"]}})
    args = container(docs, "Deployment")["args"]
    assert "--all-namespaces" not in args
    assert args[1:5] == ["--namespace", "team-a", "--namespace", "team-b"]
    roles = [d for d in by_kind(docs, "Role") if d["metadata"]["name"].endswith("-workloads")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rules_as_set(role["rules"]) == EXPECTED_WORKLOADS
    assert not [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"].endswith("-workloads")]
    assert rules_as_set(one(docs, "ClusterRole", "-cluster")["rules"]) == EXPECTED_CLUSTER | FOREIGN_PODS
    bindings = [d for d in by_kind(docs, "RoleBinding") if d["metadata"]["name"].endswith("-workloads")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "rel-meshplan", "namespace": "meshplan-system"}]


def test_empty_namespace_list_is_refused_with_the_value_name():
    err = render_error({"watch": {"allNamespaces": False, "namespaces": []}})
    assert "watch.namespaces" in err


def test_more_than_one_replica_is_refused():
    """kopf pauses every operator sharing a priority: replicas of one Deployment cannot be a standby."""
    assert "replicaCount" in render_error({"replicaCount": 2})


def _arg(c: dict, flag: str) -> str:
    return c["args"][c["args"].index(flag) + 1]


def test_standby_is_a_second_deployment_with_a_lower_priority():
    docs = render({"peering": {"enabled": True, "name": "ha", "priority": 10, "standby": {"enabled": True,
                                                                                         "priority": 5}}})
    deps = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert set(deps) == {"rel-meshplan", "rel-meshplan-standby"}
    prio = {}
    for name, dep in deps.items():
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert _arg(c, "--peering") == "ha" and "--standalone" not in c["args"]
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
        prio[name] = int(_arg(c, "--priority"))
    assert prio == {"rel-meshplan": 10, "rel-meshplan-standby": 5}
    # the two selectors must not claim each other's pods
    sel = [d["spec"]["selector"]["matchLabels"] for d in deps.values()]
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in deps.values()]
    assert not all(pods[1].get(k) == v for k, v in sel[0].items())
    assert not all(pods[0].get(k) == v for k, v in sel[1].items())
    assert one(docs, "ClusterKopfPeering")["metadata"]["name"] == "ha"
    assert {d["metadata"]["name"] for d in by_kind(docs, "CustomResourceDefinition")} == {
        "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


def test_standby_misconfigurations_are_refused_with_the_value_name():
    assert "peering.enabled" in render_error({"peering": {"standby": {"enabled": True}}})
    err = render_error({"peering": {"enabled": True, "priority": 5, "standby": {"enabled": True, "priority": 5}}})
    assert "peering.standby.priority" in err


# ---- RBAC ---------------------------------------------------------------------------------------

def _all_rbac(docs):
    return [d for d in docs if d["kind"] in ("ClusterRole", "Role")]


@pytest.mark.parametrize("values", [
    {}, {"peering": {"enabled": True}, "computeDomains": {"enabled": True}},
    {"watch": {"allNamespaces": False, "namespaces": ["x"]}, "peering": {"enabled": True}},
])
def test_rbac_has_no_wildcards_and_no_versioned_groups(values):
    for role in _all_rbac(render(values)):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{role['metadata']['name']}: wildcard in {key}"
            for group in rule["apiGroups"]:
                assert "/" not in group, f"{role['metadata']['name']}: API group {group!r} carries a version"
            assert "nonResourceURLs" not in rule


def test_default_rbac_is_exactly_what_the_operator_needs():
    docs = render()
    assert rules_as_set(one(docs, "ClusterRole", "-cluster")["rules"]) == EXPECTED_CLUSTER
    assert rules_as_set(one(docs, "ClusterRole", "-workloads")["rules"]) == EXPECTED_WORKLOADS
    for binding in by_kind(docs, "ClusterRoleBinding"):
        if binding["metadata"]["name"].endswith(("-cluster", "-workloads")):
            assert binding["subjects"][0]["name"] == one(docs, "ServiceAccount", "rel-meshplan")["metadata"]["name"]


def test_peering_and_compute_domain_rights_only_when_enabled():
    on = render({"peering": {"enabled": True}, "computeDomains": {"enabled": True}})
    assert rules_as_set(one(on, "ClusterRole", "-cluster")["rules"]) == \
        EXPECTED_CLUSTER | grants("kopf.dev", ["clusterkopfpeerings"], PEERING_VERBS)
    assert rules_as_set(one(on, "ClusterRole", "-workloads")["rules"]) == \
        EXPECTED_WORKLOADS | grants("resource.nvidia.com", ["computedomains"], WRITE_CHILD)
    namespaced = render({"watch": {"allNamespaces": False, "namespaces": ["x"]}, "peering": {"enabled": True}})
    role = [r for r in by_kind(namespaced, "Role") if r["metadata"]["name"].endswith("-workloads")][0]
    assert rules_as_set(role["rules"]) == EXPECTED_WORKLOADS | grants("kopf.dev", ["kopfpeerings"], PEERING_VERBS)
    assert one(namespaced, "KopfPeering")["metadata"]["namespace"] == "x"


# ---- Pod Security ------------------------------------------------------------------------------

def _pod_specs(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


@pytest.mark.parametrize("values", [{}, {"watch": {"allNamespaces": False, "namespaces": ["x"]}}])
def test_every_pod_passes_restricted_pod_security(values):
    specs = dict(_pod_specs(render(values)))
    assert set(specs) == {"rel-meshplan", "rel-meshplan-cleanup"}
    for name, spec in specs.items():
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0, name
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", name
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), name
        for vol in spec.get("volumes", []):
            assert set(vol) <= {"name", "emptyDir", "configMap", "secret", "projected"}, (name, vol)
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert not sc.get("privileged"), name
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], name


# ---- metrics --------------------------------------------------------------------------------------

def test_metrics_service_and_servicemonitor_only_when_asked():
    docs = render()
    svc = one(docs, "Service", "-metrics")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    dep = one(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert not by_kind(docs, "ServiceMonitor")
    docs = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    svc_labels = one(docs, "Service", "-metrics")["metadata"]["labels"]
    assert all(svc_labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    off = render({"metrics": {"enabled": False}})
    assert not by_kind(off, "Service") and "--metrics-port" not in json.dumps(off)


def test_engine_podmonitor_labels_what_the_autoscaler_queries():
    from meshplan.autoscale.promql import DEFAULT_DEPLOYMENT_LABEL, DEFAULT_NAMESPACE_LABEL
    from meshplan.render.workloads import LABEL_DEPLOYMENT, LABEL_ROLE, base_labels

    assert not by_kind(render(), "PodMonitor")
    docs = render({"engineMetrics": {"podMonitor": {"enabled": True}},
                   "watch": {"allNamespaces": False, "namespaces": ["team-a"]}})
    monitors = {d["metadata"]["name"]: d for d in by_kind(docs, "PodMonitor")}
    assert set(monitors) == {"rel-meshplan-engines", "rel-meshplan-engines-nim"}
    pm = monitors["rel-meshplan-engines"]
    # NVIDIA NIM serves /v1/metrics (its own PodMonitor); DeepSpeed-MII exports no metrics: neither is
    # scraped at /metrics
    assert {"key": "app.kubernetes.io/name", "operator": "NotIn", "values": ["nim", "deepspeed"]} in \
        pm["spec"]["selector"]["matchExpressions"]
    nim = monitors["rel-meshplan-engines-nim"]
    assert nim["spec"]["podMetricsEndpoints"][0]["path"] == "/v1/metrics"
    nim_leader = {**base_labels("llama", "nim"), LABEL_ROLE: "leader"}
    assert all(nim_leader.get(k) == v for k, v in nim["spec"]["selector"]["matchLabels"].items())
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    # the selector matches a leader pod as the renderer labels it
    leader = {**base_labels("llama", "vllm"), LABEL_ROLE: "leader"}
    assert all(leader.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items())
    endpoint = pm["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    targets = {r["targetLabel"]: r["sourceLabels"][0] for r in endpoint["relabelings"]}
    pod_label_meta = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", LABEL_DEPLOYMENT)
    assert targets[DEFAULT_DEPLOYMENT_LABEL] == pod_label_meta
    assert targets[DEFAULT_NAMESPACE_LABEL] == "__meta_kubernetes_namespace"
    # a disaggregated deployment's per-role queries select on the role label
    from meshplan.controller.autoscaling_roles import ROLE_LABEL
    from meshplan.render.inference_pool import LABEL_SERVING_ROLE

    for m in (pm, nim):
        t = {r["targetLabel"]: r["sourceLabels"][0] for r in m["spec"]["podMetricsEndpoints"][0]["relabelings"]}
        assert t[ROLE_LABEL] == "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", LABEL_SERVING_ROLE)
    for cluster_wide in by_kind(render({"engineMetrics": {"podMonitor": {"enabled": True}}}), "PodMonitor"):
        assert cluster_wide["spec"]["namespaceSelector"] == {"any": True}


# ---- pre-delete hook ---------------------------------------------------------------------------

@pytest.mark.parametrize("values", [{}, {"watch": {"allNamespaces": False, "namespaces": ["a", "b"]}}])
def test_cleanup_hook_runs_before_delete_with_the_operator_scope(values):
    docs = render(values)
    job = one(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[:3] == ["python", "-m", "meshplan.commands.cleanup"]
    scope = [a for a in container(docs, "Deployment")["args"] if a.startswith("--") and "namespace" in a]
    assert [a for a in cmd if a in ("--all-namespaces", "--namespace")] == scope
    hook_sa = job["spec"]["template"]["spec"]["serviceAccountName"]
    assert hook_sa != one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    # every hook resource runs before the Job (lower weight) and is a pre-delete hook itself
    job_weight = int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    hook_docs = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "pre-delete"]
    assert {d["kind"] for d in hook_docs} >= {"ServiceAccount", "Job"}
    for d in hook_docs:
        if d["kind"] != "Job":
            assert int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) < job_weight
    hook_rules = set().union(*(rules_as_set(d["rules"]) for d in hook_docs if d["kind"] in ("Role", "ClusterRole")))
    assert hook_rules == grants("meshplan.dev", ["llmdeployments"], READ + ["delete", "patch"])


def test_cleanup_hook_command_parses():
    """The hook's exact arguments are accepted by the module the image runs."""
    from meshplan.commands import cleanup

    cmd = one(render(), "Job")["spec"]["template"]["spec"]["containers"][0]["command"]
    import argparse
    p = argparse.ArgumentParser()
    cleanup.add_arguments(p)
    args = p.parse_args(cmd[3:])
    assert args.all_namespaces and args.timeout_seconds == 180 and args.remove_finalizers_on_timeout
    job = one(render(), "Job")
    worst_case_s = args.timeout_seconds + cleanup.FINALIZER_GRACE_S
    assert job["spec"]["activeDeadlineSeconds"] > worst_case_s
    assert worst_case_s + 60 <= 300, "the hook would outlast helm uninstall's default --timeout (5m)"


def test_cleanup_disabled_renders_no_hook():
    assert not [d for d in render({"cleanup": {"enabled": False}}) if "helm.sh/hook" in
                d["metadata"].get("annotations", {}) and d["kind"] != "ClusterKopfPeering"]


def test_operator_args_parse_with_meshplan_run():
    """The Deployment's args are accepted by the real `meshplan run` parser (the controller helper's)."""
    import importlib.util
    if importlib.util.find_spec("meshplan.commands.run") is None:
        pytest.skip("meshplan.commands.run is not written yet (controller, issue 5)")
    from meshplan.cli import build_parser

    for values in ({}, {"watch": {"allNamespaces": False, "namespaces": ["a", "b"]},
                        "peering": {"enabled": True, "priority": 7}}):
        args = container(render(values), "Deployment")["args"]
        parsed = build_parser(args).parse_args(args)
        assert parsed.command == "run"
        assert parsed.metrics_port == 8080 and parsed.liveness.endswith(":8081/healthz")
        if values:
            assert parsed.namespace == ["a", "b"] and parsed.peering == "meshplan" and parsed.priority == 7
        else:
            assert parsed.all_namespaces and parsed.standalone


# ---- values, schema, docs --------------------------------------------------------------------------

def _leaf_paths(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= _leaf_paths(v, path + ".")
        out.add(path)
    return out


def _schema_paths(schema: dict, root: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in schema.get("properties", {}).items():
        if "$ref" in v:
            v = root["definitions"][v["$ref"].rsplit("/", 1)[1]]
        out.add(f"{prefix}{k}")
        if v.get("type") == "object" and "properties" in v:
            out |= _schema_paths(v, root, f"{prefix}{k}.")
    return out


def test_values_and_schema_agree():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    value_paths = {p for p in _leaf_paths(values) if not p.startswith(("resources.", "cleanup.resources."))}
    schema_paths = {p for p in _schema_paths(schema, schema)
                    if not p.startswith(("resources.", "cleanup.resources."))}
    assert value_paths == schema_paths
    assert schema["additionalProperties"] is False


def test_every_value_is_documented():
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w]*):", line)
        if not m or m.group(2) in ("requests", "limits", "cpu", "memory"):
            continue
        prev = lines[i - 1].strip() if i else ""
        if not prev.startswith("#") and "#" not in line.split(":", 1)[1]:
            undocumented.append(m.group(2))
    assert not undocumented, f"values without a comment above them: {undocumented}"


@pytest.mark.parametrize("values, field", [
    ({"bogus": 1}, "bogus"),
    ({"image": {"digest": "latest"}}, "digest"),
    ({"watch": {"namespaces": ["Not_A_Namespace"]}}, "namespaces"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
    ({"cleanup": {"timeoutSeconds": 1}}, "timeoutSeconds"),
    ({"prometheusUrl": "prometheus:9090"}, "prometheusUrl"),
    ({"prometheusUrl": "http://user:pw@prometheus:9090"}, "prometheusUrl"),
])
def test_schema_refuses_bad_values_naming_the_field(values, field):
    assert field in render_error(values)
