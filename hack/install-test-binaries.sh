#!/usr/bin/env bash
# Builds pinned kube-apiserver, kube-controller-manager, kubectl, etcd and helm,
# and the node's kubelet, kube-scheduler and kube-proxy (internal/localenv/node),
# from the Go module proxy, once, and caches the finished binaries under
# $HOME/.cache. Prints the folder that holds them as its last line of stdout.
# A second call returns at once. Progress goes to stderr.
#
#   hack/install-test-binaries.sh              build what is missing, print the folder
#   hack/install-test-binaries.sh --print-dir  print the folder if complete, else exit 1;
#                                              never builds (the Go test helpers use this)
#   hack/install-test-binaries.sh --without-helm
#                                              the control plane only: no helm, no node
#                                              (the local demo, hack/demo.sh: saves about
#                                              half the build on a fresh machine)
#
# Environment: K8S_VERSION, ETCD_VERSION, HELM_VERSION (pins),
# KUBE_BIND_BACKEND_CACHE (cache root, default $HOME/.cache/kube-bind-backend).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"

cache_root="${KUBE_BIND_BACKEND_CACHE:-$HOME/.cache/kube-bind-backend}"
# "-node": this folder also holds the node's binaries, so a folder of an
# earlier version of this script is never taken for a complete one.
dest="$cache_root/k8s-${K8S_VERSION}-node-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
# The folder of that earlier version: binaries found there are copied, not rebuilt.
old_dest="$cache_root/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-helm-${HELM_VERSION}"
node_cmds=(kubelet kube-scheduler kube-proxy)
k8s_cmds=(kube-apiserver kube-controller-manager kubectl "${node_cmds[@]}")
all=("${k8s_cmds[@]}" etcd helm)
mode="${1:-}"
case "$mode" in
  ""|--print-dir) ;;
  --without-helm) k8s_cmds=(kube-apiserver kube-controller-manager kubectl); all=("${k8s_cmds[@]}" etcd); mode="" ;;
  *) echo "usage: $0 [--print-dir | --without-helm]" >&2; exit 2 ;;
esac

log() { printf '[install-test-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

find_missing() {
  missing=()
  for b in "${all[@]}"; do [ -x "$dest/$b" ] || missing+=("$b"); done
  # An earlier recipe built helm without its version stamps (then it says
  # v3.22 and templates for Kubernetes 1.20): build it again.
  if [ "${1:-}" != "--print-dir" ] && [[ " ${all[*]} " == *" helm "* ]] && [ -x "$dest/helm" ] && [ "$("$dest/helm" version --template '{{.Version}}' 2>/dev/null)" != "$HELM_VERSION" ]; then
    missing+=(helm)
  fi
}

find_missing "$mode"
if [ ${#missing[@]} -eq 0 ]; then
  echo "$dest"
  exit 0
fi
if [ "$mode" = "--print-dir" ]; then
  echo "not built yet: ${missing[*]} in $dest; run hack/install-test-binaries.sh" >&2
  exit 1
fi

# One build at a time: a second caller waits for the first and then finds
# the binaries in the cache.
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
if ! flock -n 9; then
  log "another build is running; waiting for it"
  flock 9
fi
find_missing
if [ ${#missing[@]} -eq 0 ]; then
  echo "$dest"
  exit 0
fi

begin=$SECONDS
mkdir -p "$dest"
# Binaries of the same pinned versions in the earlier folder are complete
# (it only ever held finished ones): copy them instead of building again.
for b in "${missing[@]}"; do
  if [ -x "$old_dest/$b" ] && [ "$b" != helm -o "$("$old_dest/$b" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]; then
    cp "$old_dest/$b" "$dest/.$b.tmp" && mv -f "$dest/.$b.tmp" "$dest/$b"
    log "copied $b from $old_dest"
  fi
done
find_missing
if [ ${#missing[@]} -eq 0 ]; then
  echo "$dest"
  exit 0
fi
log "building ${missing[*]} into $dest (about 5-15 minutes on a fresh 2-core machine; cached afterwards)"
mkdir -p "$dest"

work=$(mktemp -d)
# A throwaway build cache: these builds would otherwise add ~3 GB to the
# machine's Go build cache. Downloaded modules stay in the module cache.
export GOCACHE="$work/gocache" GOFLAGS=-buildvcs=false GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0
build_pid=""
cleanup() {
  [ -z "$build_pid" ] || kill "$build_pid" 2>/dev/null || true
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/out"

need() { for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

# quiet runs a command with its output in a log, shown only if it fails.
quiet() {
  local out="$work/cmd.log"
  if ! "$@" >"$out" 2>&1; then
    log "failed: $*"
    tail -n 40 "$out" >&2
    exit 1
  fi
}

# build compiles package $2 into $work/out/$1 (extra go build flags after),
# logging every 15 s how many packages are compiled.
build() {
  local name=$1 pkg=$2; shift 2
  local total blog="$work/build-$name.log" start=$SECONDS last=$SECONDS
  total=$(go list -deps "$pkg" 2>/dev/null | wc -l) || total="?"
  log "building $name ($total packages to compile at most)"
  # -v prints each package as it is compiled: that is the progress.
  go build -v -trimpath "$@" -o "$work/out/$name" "$pkg" 2>"$blog" &
  build_pid=$!
  while kill -0 "$build_pid" 2>/dev/null; do
    sleep 1
    if (( SECONDS - last >= 15 )); then
      last=$SECONDS
      log "$name: $(wc -l <"$blog") of $total packages compiled ($(( SECONDS - start ))s)"
    fi
  done
  if ! wait "$build_pid"; then
    build_pid=""
    log "building $name failed:"
    grep -v '^[a-z0-9./_-]*$' "$blog" | tail -n 40 >&2 || tail -n 40 "$blog" >&2
    exit 1
  fi
  build_pid=""
  # Copy next to the target, then rename: the cache never holds a partial
  # binary, even across file systems or when interrupted.
  cp "$work/out/$name" "$dest/.$name.tmp"
  chmod +x "$dest/.$name.tmp"
  mv -f "$dest/.$name.tmp" "$dest/$name"
  log "done: $dest/$name ($(( SECONDS - start ))s)"
}

if need "${k8s_cmds[@]}"; then
  log "resolving k8s.io/kubernetes@$K8S_VERSION"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  quiet go mod init wrapper
  quiet go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  kdir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$kdir" ] || { log "cannot download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  # k8s.io/kubernetes replaces its staging modules with local folders, which
  # a module download lacks: point each at its published version instead.
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
    quiet go get "k8s.io/kubernetes/cmd/$cmd@$K8S_VERSION"
    build "$cmd" "k8s.io/kubernetes/cmd/$cmd" -ldflags "$ldflags"
  done
fi

if need etcd; then
  mkdir -p "$work/etcd" && cd "$work/etcd"
  quiet go mod init wrapper
  quiet go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  build etcd go.etcd.io/etcd/server/v3 -ldflags "-s -w"
fi

if need helm; then
  mkdir -p "$work/helm" && cd "$work/helm"
  quiet go mod init wrapper
  quiet go get "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  # As helm's Makefile does: its version, and the Kubernetes version of its
  # client-go as the default for `helm template` and `helm lint` (else 1.20).
  kminor=$(go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)
  hflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    hflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
  done
  build helm helm.sh/helm/v3/cmd/helm -ldflags "$hflags"
fi

log "all built in $(( SECONDS - begin ))s"
echo "$dest"
