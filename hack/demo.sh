#!/usr/bin/env bash
# The local demo: a real control plane as the provider cluster (with the
# kube-bind CRDs and two example APIs), a real OpenID Connect provider with a
# demo user, and the backend on http://127.0.0.1:8080. It prints the export
# URL, the user's credentials and the command that binds; Ctrl-C stops it all.
#
#   hack/demo.sh [--listen-address 127.0.0.1:8080] [--oidc-address 127.0.0.1:5556]
#                [--state-dir DIR] [--user demo] [--password demo-password]
#
# On a fresh machine it first installs the OIDC provider's npm packages and
# builds the pinned Kubernetes binaries (minutes, once; then cached). It
# needs no browser of its own: open the printed URL in any browser.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBE_BIND_DEMO_T0=$(date +%s%N)
export KUBE_BIND_DEMO_T0

state=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --state-dir=*) state="${args[i]#--state-dir=}" ;;
    --state-dir) state="${args[i + 1]:-}" ;;
  esac
done
if [ -z "$state" ]; then
  state=$(mktemp -d "${TMPDIR:-/tmp}/kube-bind-demo-XXXXXX")
  set -- --state-dir "$state" "$@"
fi
mkdir -p "$state/bin"

bash hack/install-test-deps.sh --no-browser
KUBE_BIND_TEST_BINARIES=$(bash hack/install-test-binaries.sh | tail -n 1)
export KUBE_BIND_TEST_BINARIES

echo "[demo $(date +%H:%M:%S)] building the backend, kube-bind-poll and the demo into $state/bin" >&2
go build -o "$state/bin/" ./cmd/backend ./cmd/kube-bind-poll ./hack/demo

# exec: the demo gets Ctrl-C and SIGTERM itself and stops everything it started.
exec "$state/bin/demo" "$@"
