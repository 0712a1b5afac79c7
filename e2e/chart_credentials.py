"""Run e2e operators with the Helm chart's ServiceAccount, not cluster-admin.

Issue 7 asks that the e2e suite's operator authenticate as the chart's
ServiceAccount, so a right missing from the chart's RBAC fails a test instead
of surfacing only in users' clusters. Two helpers:

- `token_kubeconfig(cluster, sa, namespace, path)`: a kubeconfig carrying a
  TokenRequest token (`kubectl create token`) for an existing ServiceAccount.
- `chart_kubeconfig(cluster, path, ...)`: applies only the chart's
  ServiceAccount and RBAC templates (`helm template --show-only`, default
  values: cluster-wide workload rights, so an operator scoped by namespace
  globs such as `mp-op-*` is covered), then returns `token_kubeconfig` for it.

- `operator_kubeconfig(cluster, path, ...)`: what e2e operators run with:
  `chart_kubeconfig`, or the cluster-admin kubeconfig when
  MESHPLAN_E2E_OPERATOR_ADMIN=1 (debugging only). Used by e2e/conftest.py's
  `operator_kubeconfig` fixture and by the reliability kit (e2e/reliability/kit.py).

Usage in an e2e module (files in e2e/ are loaded by path, like operator_runner):

    kcfg = chart_credentials.chart_kubeconfig(cluster, tmp_path / "sa.kubeconfig")
    OperatorProcess(kcfg, ["mp-op-*"]).start()
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "meshplan"
ADMIN_ENV = "MESHPLAN_E2E_OPERATOR_ADMIN"
# Long enough for the slow reliability scenarios and the 30-minute soak in one session.
TOKEN_DURATION_S = 6 * 3600
KUBE_VERSION = "1.36.3"  # a go-built helm defaults to an old kube version (cluster-harness.md)


def token_kubeconfig(cluster, sa: str, namespace: str, path: Path, duration_s: int = TOKEN_DURATION_S) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `namespace/sa` (TokenRequest API)."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, f"--duration={duration_s}s").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "dev", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": sa, "namespace": namespace}}],
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def render(cluster, templates: list[str], namespace: str, release: str = "e2e",
           values: dict[str, Any] | None = None) -> str:
    """`helm template` of some of the chart's templates (YAML text); `values` as dotted keys."""
    argv = [cluster.binary("helm"), "template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    for t in templates:
        argv += ["--show-only", t]
    for key, value in (values or {}).items():
        argv += ["--set-json", f"{key}={json.dumps(value)}"]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def chart_kubeconfig(cluster, path: Path, namespace: str = "meshplan-e2e-operator", release: str = "e2e",
                     values: dict[str, Any] | None = None) -> Path:
    """Apply the chart's ServiceAccount + RBAC (nothing else) and return a token kubeconfig for it."""
    cluster.kubectl("create", "namespace", namespace, check=False)  # exists on a reused cluster
    rendered = render(cluster, ["templates/serviceaccount.yaml", "templates/rbac.yaml"], namespace, release, values)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=meshplan-e2e",
                    "-f", "-", input=rendered)
    sa = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceAccount")
    return token_kubeconfig(cluster, sa["metadata"]["name"], namespace, path)


def operator_kubeconfig(cluster, path: Path, namespace: str = "meshplan-e2e-operator", release: str = "e2e",
                        values: dict[str, Any] | None = None) -> Path:
    """Credentials for an e2e operator: the chart's ServiceAccount (`chart_kubeconfig`), so a right missing
    from the chart's RBAC fails a test; cluster-admin only when MESHPLAN_E2E_OPERATOR_ADMIN=1."""
    if os.environ.get(ADMIN_ENV):
        return Path(cluster.kubeconfig)
    return chart_kubeconfig(cluster, path, namespace=namespace, release=release, values=values)
