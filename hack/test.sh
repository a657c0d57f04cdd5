#!/usr/bin/env bash
# Runs the whole test suite against real parts: it installs what a fresh
# machine lacks (the pinned Kubernetes binaries and helm, chromium, the test
# OpenID Connect provider's npm packages), then runs go test with -race.
# Extra arguments go to go test (default: ./...).
set -euo pipefail
cd "$(dirname "$0")/.."

t0=$SECONDS
bash hack/install-test-deps.sh
t1=$SECONDS
export KUBE_BIND_TEST_BINARIES
KUBE_BIND_TEST_BINARIES=$(bash hack/install-test-binaries.sh | tail -n 1)
t2=$SECONDS
echo "test dependencies: $((t1 - t0))s; test binaries: $((t2 - t1))s ($KUBE_BIND_TEST_BINARIES)"

# Screenshots and other artefacts of the tests land here.
export KUBE_BIND_TEST_ARTIFACTS="${KUBE_BIND_TEST_ARTIFACTS:-$PWD/_artifacts}"

if [ $# -eq 0 ]; then set -- ./...; fi
# -p 1: the machine has 2 cores and several packages start a control plane.
exec go test -race -p 1 -timeout 40m -count=1 "$@"
