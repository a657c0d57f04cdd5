#!/usr/bin/env bash
# Builds pinned kube-apiserver, kube-controller-manager, kubectl, etcd and helm
# from the Go module proxy, once, and caches the finished binaries under
# $HOME/.cache. Prints the folder that holds them as its last line of stdout.
# A second call returns at once. Progress goes to stderr.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"

cache_root="${KUBE_BIND_BACKEND_CACHE:-$HOME/.cache/kube-bind-backend}"
dest="$cache_root/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
k8s_cmds=(kube-apiserver kube-controller-manager kubectl)
all=("${k8s_cmds[@]}" etcd helm)

log() { printf '[install-test-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

missing=()
for b in "${all[@]}"; do [ -x "$dest/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$dest"
  exit 0
fi
log "building ${missing[*]} into $dest (takes a few minutes on a fresh machine)"
mkdir -p "$dest"

work=$(mktemp -d)
# A throwaway build cache: these builds would otherwise add ~3 GB to the
# machine's Go build cache.
export GOCACHE="$work/gocache" GOFLAGS=-buildvcs=false GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

need() { for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

# Builds into $work first and moves each binary into the cache only once it
# is complete, so an interrupted run never leaves a broken binary behind.
install_bin() { chmod +x "$work/out/$1"; mv -f "$work/out/$1" "$dest/$1"; log "done: $dest/$1"; }
mkdir -p "$work/out"

if need "${k8s_cmds[@]}"; then
  log "resolving k8s.io/kubernetes@$K8S_VERSION"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init wrapper >/dev/null 2>&1
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  kdir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  staging_version="v0.${K8S_VERSION#v1.}"
  for mod in $(grep -oE '^[[:space:]]*k8s\.io/[a-z0-9-]+ => \./staging' "$kdir/go.mod" | awk '{print $1}' | grep -v '^k8s.io/sample-'); do
    go mod edit -replace="$mod=$mod@$staging_version"
  done
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  for cmd in "${k8s_cmds[@]}"; do
    need "$cmd" || continue
    log "building $cmd $K8S_VERSION"
    go get "k8s.io/kubernetes/cmd/$cmd@$K8S_VERSION" >/dev/null 2>&1
    go build -trimpath -ldflags "$ldflags" -o "$work/out/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    install_bin "$cmd"
  done
fi

if need etcd; then
  log "building etcd $ETCD_VERSION"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init wrapper >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
  go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" go.etcd.io/etcd/server/v3
  install_bin etcd
fi

if need helm; then
  log "building helm $HELM_VERSION"
  GOBIN="$work/out" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  install_bin helm
fi

echo "$dest"
