#!/usr/bin/env bash
# Measures the walks of docs/architecture.md (hack/walk): builds the walk
# with statement coverage of the module and runs it against a real
# control plane and identity provider (as the tests install them).
set -euo pipefail
cd "$(dirname "$0")/.."
export KUBE_BIND_TEST_BINARIES="${KUBE_BIND_TEST_BINARIES:-$(bash hack/install-test-binaries.sh | tail -n 1)}"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -cover -covermode=atomic -coverpkg=./... -o "$bin/walk" ./hack/walk
"$bin/walk" "$@"
