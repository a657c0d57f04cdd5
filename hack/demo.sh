#!/usr/bin/env bash
# The local demo: a real control plane as the provider cluster (with the
# kube-bind CRDs and two example APIs), a second one as the consumer cluster,
# a real OpenID Connect provider with a demo user, and the backend on
# http://127.0.0.1:8080. It prints the export URL, the user's credentials and
# the one command that binds into the consumer cluster, and runs the
# konnector that command deploys as a local process (the clusters have no
# nodes); Ctrl-C stops it all.
#
#   hack/demo.sh [--node] [--listen-address 127.0.0.1:8080] [--oidc-address 127.0.0.1:5556]
#                [--diagnostics-address 127.0.0.1:9090]
#                [--state-dir DIR] [--user demo] [--password demo-password]
#
# --node (as root): the provider cluster gets a real node, and the backend
# runs as the chart's two pods (helm install), behind their Service at
# http://10.0.0.200; the identity provider listens on the node's address.
#
# On a fresh machine it first installs the OIDC provider's npm packages and
# builds the pinned Kubernetes binaries (minutes, once; then cached). It
# needs no browser of its own: open the printed URL in any browser.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBE_BIND_DEMO_T0=$(date +%s%N)
export KUBE_BIND_DEMO_T0

log() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

node=""
for arg in "$@"; do if [ "$arg" = --node ]; then node=yes; fi; done
if [ -n "$node" ]; then
  # The node's runtime, kubelet & co. and helm.
  bash hack/install-test-deps.sh --no-browser --node
  KUBE_BIND_TEST_BINARIES=$(bash hack/install-test-binaries.sh | tail -n 1)
else
  bash hack/install-test-deps.sh --no-browser
  KUBE_BIND_TEST_BINARIES=$(bash hack/install-test-binaries.sh --without-helm | tail -n 1)
fi
export KUBE_BIND_TEST_BINARIES

# A folder per checkout that stays: go build relinks only what changed, so a
# second start skips the link steps (tens of seconds on 2 cores).
cache_root="${KUBE_BIND_BACKEND_CACHE:-$HOME/.cache/kube-bind-backend}"
bin="$cache_root/demo-bin/$(pwd -P | sha256sum | cut -c1-12)"
mkdir -p "$bin"
t=$SECONDS
log "building the backend, kube-bind-poll, the demo and the konnector's network bridge into $bin"
go build -o "$bin/" ./cmd/backend ./cmd/kube-bind-poll ./hack/demo ./internal/localenv/konnector/netbridge
# kubectl finds plugins on PATH by name: `kubectl bind-poll` runs this.
ln -f "$bin/kube-bind-poll" "$bin/kubectl-bind_poll"
if [ -n "$node" ]; then
  # The image's backend: static, as the Dockerfile builds it.
  CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" -o "$bin/backend-static" ./cmd/backend
fi
log "built in $((SECONDS - t))s"

# exec: the demo gets Ctrl-C and SIGTERM itself and stops everything it started.
exec "$bin/demo" "$@"
