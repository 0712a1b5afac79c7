#!/usr/bin/env bash
# Build the local control plane from Go modules into a cache outside the repo.
#
# Why from source: these machines have no Docker and no container registry, so
# kind/k3d cannot run; the pieces envtest and kwokctl run are built from the Go
# module proxy instead (see ../shared/docs/cluster-harness.md for the facts).
#
# Idempotent: each binary is skipped when its cached copy reports the pinned
# version. Go's module and build caches stay in their default locations so a
# second machine-local build only relinks.
set -euo pipefail

K8S_VERSION="${MESHPLAN_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${MESHPLAN_ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${MESHPLAN_KWOK_VERSION:-v0.7.0}"   # v0.8+ needs explicit stage configs
HELM_VERSION="${MESHPLAN_HELM_VERSION:-v3.21.4}"
# Gateway API Inference Extension: its CRDs (InferencePool, ...) for the local cluster, from the Go module's
# config/crd/bases/ (v1.6.0: the newest release the Go module proxy serves here; v1.6.1+ and v1.7.x refused)
GIE_VERSION="${MESHPLAN_GIE_VERSION:-v1.6.0}"
CACHE="${MESHPLAN_E2E_CACHE:-$HOME/.cache/meshplan-e2e}"
BIN="$CACHE/bin-k8s-$K8S_VERSION"
mkdir -p "$BIN"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf '[build] %s\n' "$*" >&2; }

have() {  # have BINARY EXPECTED_SUBSTRING VERSION_ARGS...
  local b="$BIN/$1" want="$2"; shift 2
  [ -x "$b" ] || return 1
  local out; out="$("$b" "$@" 2>&1 || true)"   # no pipe into grep -q: SIGPIPE + pipefail = false negative
  [[ "$out" == *"$want"* ]]
}

build_kubernetes() {
  if have kube-apiserver "$K8S_VERSION" --version && have kube-scheduler "$K8S_VERSION" --version \
     && have kube-controller-manager "$K8S_VERSION" --version && have kubectl "$K8S_VERSION" version --client; then
    log "kubernetes $K8S_VERSION cached"; return; fi
  local work="$CACHE/src/k8s-$K8S_VERSION"; mkdir -p "$work"; cd "$work"
  local minor="${K8S_VERSION#v1.}"; local staging="v0.${minor}"
  if [ ! -f go.mod ]; then
    go mod init meshplan.local/k8s-build >/dev/null 2>&1
  fi
  # k8s.io/kubernetes' go.mod pins every staging module at v0.0.0 and replaces it
  # with ./staging/src/...; a consumer must replace each with its published tag.
  local modfile; modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
  [ -f "$modfile" ] || go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  grep -E '^\s*k8s.io/[^ ]+ => ./staging/src/' "$modfile" | awk '{print $1}' | sort -u | while read -r m; do
    go mod edit -replace "$m=$m@$staging"
  done
  log "go get k8s.io/kubernetes@$K8S_VERSION (staging $staging)"
  # getting the command packages (not just the module) records every module they import in go.sum
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" 2>&1 | tail -5 >&2
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local ld="-s -w"
  local maj=1 min="${minor%%.*}"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$maj -X $pkg.gitMinor=$min -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  # kubectl of the same minor as the server (the machine's kubectl may be older than the
  # supported +/-1 skew)
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    if [ "$c" != kubectl ] && have "$c" "$K8S_VERSION" --version; then continue; fi
    log "go build $c"
    go build -trimpath -ldflags "$ld" -o "$BIN/$c" "k8s.io/kubernetes/cmd/$c"
  done
}

build_etcd() {
  if have etcd "${ETCD_VERSION#v}" --version; then log "etcd $ETCD_VERSION cached"; return; fi
  local work="$CACHE/src/etcd-$ETCD_VERSION"; mkdir -p "$work"; cd "$work"
  [ -f go.mod ] || go mod init meshplan.local/etcd-build >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" 2>&1 | tail -5 >&2
  log "go build etcd"
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
}

build_gotool() {  # build_gotool NAME MODULE_PATH VERSION EXTRA_LDFLAGS VERSION_ARGS...
  local name="$1" mod="$2" ver="$3" ldx="$4"; shift 4
  if have "$name" "$ver" "$@"; then log "$name $ver cached"; return; fi
  log "go install $mod@$ver"
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w $ldx" "$mod@$ver"
}

fetch_gie_crds() {  # the CRD manifests of the Gateway API Inference Extension, into $CACHE/crds-gie-<version>
  local dest="$CACHE/crds-gie-$GIE_VERSION"
  if [ -f "$dest/inference.networking.k8s.io_inferencepools.yaml" ]; then log "inference extension CRDs $GIE_VERSION cached"; return; fi
  local dir; dir="$(cd "$CACHE" && go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$GIE_VERSION" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
  mkdir -p "$dest.tmp" && cp "$dir"/config/crd/bases/*.yaml "$dest.tmp/" && chmod u+w "$dest.tmp"/*.yaml
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  log "inference extension CRDs $GIE_VERSION in $dest"
}

build_kubernetes
build_etcd
fetch_gie_crds
build_gotool kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" "" --version
# helm stamps its version by ldflags in release builds; without it `helm version` says v3.21
build_gotool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" version
ln -sfn "$BIN" "$CACHE/bin"
log "binaries in $BIN"
ls -la "$BIN" >&2
