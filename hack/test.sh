#!/usr/bin/env bash
# Runs the whole test suite against real parts: it installs what a fresh
# machine lacks (the pinned Kubernetes binaries and helm, chromium, the test
# OpenID Connect provider's npm packages), then runs go test with -race.
# Extra arguments go to go test (default: ./...).
set -euo pipefail
cd "$(dirname "$0")/.."

bash hack/install-test-deps.sh
export KUBE_BIND_TEST_BINARIES
KUBE_BIND_TEST_BINARIES=$(bash hack/install-test-binaries.sh | tail -n 1)
echo "test binaries: $KUBE_BIND_TEST_BINARIES"

if [ $# -eq 0 ]; then set -- ./...; fi
# -p 1: the machine has 2 cores and several packages start a control plane.
exec go test -race -p 1 -timeout 40m -count=1 "$@"
