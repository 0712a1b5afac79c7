#!/usr/bin/env bash
# Create a kind cluster whose workers look like GPU nodes, build the operator
# image, and install the meshplan chart -- for users who have Docker.
#
# NOT RUN IN THIS REPOSITORY'S CI: the machines that build and test meshplan
# have no Docker engine, so kind cannot start there (the e2e suite uses a real
# control plane with kwok nodes instead, see e2e/conftest.py).
# tests/test_chart_kind.py checks its syntax (`bash -n`), runs its fleet ->
# label step, and checks that the chart values it sets exist.
#
# What you get: the workers carry the labels NVIDIA GPU feature discovery sets
# (nvidia.com/gpu.product, .count, .memory, .family, .clique) and an
# `nvidia.com/gpu` capacity patched into their status (Kubernetes docs,
# "Advertise Extended Resources for a Node"), copied from a built-in fleet
# (operator/meshplan/fleets/*.yaml) by meshplan itself, so `meshplan plan
# --kubeconfig` and the operator plan and place on them. There are no GPUs:
# engine pods are scheduled and placed, then fail to start (Available stays
# False); Planned and Placed, `kubectl get llmd` and `kubectl describe llmd`
# show the plan. A kubelet restart drops the patched capacity: run
# `create-cluster.sh --gpus-only` again.
#
# Requirements: docker, kind (>= 0.20), kubectl, helm 3, and this repository
# installed in the current Python environment (`pip install -e .`).
#
# Usage:
#   e2e/kind/create-cluster.sh                 # cluster "meshplan", fleet hgx-h100
#   FLEET=gb200-nvl72 e2e/kind/create-cluster.sh
#   e2e/kind/create-cluster.sh --gpus-only     # re-apply GPU labels/capacity only
#   kind delete cluster --name meshplan        # remove everything
set -euo pipefail

CLUSTER="${CLUSTER:-meshplan}"
FLEET="${FLEET:-hgx-h100}"
IMAGE="${IMAGE:-meshplan:dev}"
NAMESPACE="${NAMESPACE:-meshplan-system}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
GPUS_ONLY=false
[[ "${1:-}" == "--gpus-only" ]] && GPUS_ONLY=true

need() { command -v "$1" >/dev/null 2>&1 || { echo "create-cluster.sh: '$1' not found: $2" >&2; exit 1; }; }
need docker "install Docker (https://docs.docker.com/engine/install/)"
need kind "install kind (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)"
need kubectl "install kubectl"
need helm "install helm 3 (https://helm.sh/docs/intro/install/)"
python3 -c "import meshplan" 2>/dev/null || { echo "create-cluster.sh: run 'pip install -e .' in $REPO first" >&2; exit 1; }

CTX="kind-$CLUSTER"
if ! $GPUS_ONLY; then
  if kind get clusters | grep -qx "$CLUSTER"; then
    echo "kind cluster $CLUSTER exists; reusing it"
  else
    # the config's name is overridden by --name
    kind create cluster --name "$CLUSTER" --config "$HERE/kind-config.yaml" --wait 120s
  fi
fi

# 1. Simulated GPUs: labels and nvidia.com/gpu capacity from the fleet's first nodes.
WORKERS=$(kubectl --context "$CTX" get nodes -l '!node-role.kubernetes.io/control-plane' \
  -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
python3 - "$FLEET" $WORKERS <<'PY' | while read -r node gpus labels; do
import sys
from meshplan.devcluster.fleets import fleet_nodes, load_fleet

fleet, workers = sys.argv[1], sys.argv[2:]
nodes = fleet_nodes(load_fleet(fleet))
if len(nodes) < len(workers):
    sys.exit(f"fleet {fleet} has {len(nodes)} nodes for {len(workers)} kind workers: use a bigger fleet")
if len(nodes) > len(workers):
    print(f"note: fleet {fleet} has {len(nodes)} nodes; simulating the first {len(workers)}", file=sys.stderr)
for worker, node in zip(workers, nodes):
    labels = {k: v for k, v in node["metadata"]["labels"].items() if k != "kubernetes.io/hostname"}
    gpus = node["status"]["allocatable"]["nvidia.com/gpu"]
    print(worker, gpus, " ".join(f"{k}={v}" for k, v in sorted(labels.items())))
PY
  # shellcheck disable=SC2086 # one argument per label
  kubectl --context "$CTX" label node "$node" --overwrite $labels >/dev/null
  # capacity via the status subresource; kubelet copies it to allocatable
  kubectl --context "$CTX" patch node "$node" --subresource=status --type=json \
    -p "[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$gpus\"}]" >/dev/null
  echo "node $node: $gpus simulated GPUs"
done
$GPUS_ONLY && exit 0

# 2. The operator image, built here and loaded into the kind nodes (no registry needed).
docker build -t "$IMAGE" "$REPO"
kind load docker-image "$IMAGE" --name "$CLUSTER"

# 3. The chart (CRDs from charts/meshplan/crds are installed by helm).
helm upgrade --install meshplan "$REPO/charts/meshplan" \
  --kube-context "$CTX" --namespace "$NAMESPACE" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --wait --timeout 180s
kubectl --context "$CTX" label namespace "$NAMESPACE" --overwrite \
  pod-security.kubernetes.io/enforce=restricted >/dev/null

cat <<MSG

meshplan is running in kind cluster $CLUSTER (context $CTX), fleet $FLEET.
  kubectl --context $CTX get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count
  kubectl --context $CTX apply -f $REPO/examples/llama-3.1-8b-1gpu.yaml
  kubectl --context $CTX get llmd -w
  meshplan plan $REPO/examples/llama-3.1-70b-hgx-h100.yaml --kubeconfig ~/.kube/config
Remove it all: kind delete cluster --name $CLUSTER
MSG
