#!/usr/bin/env bash
# Runs the whole test suite against real parts: it installs what a fresh
# machine lacks (the pinned Kubernetes binaries and helm, chromium, the test
# OpenID Connect provider's npm packages), then runs go test with -race,
# then every fuzz target for a few seconds (hack/fuzz.sh).
# Extra arguments go to go test (default: ./...); with them, only go test
# runs (no fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."

# The lint gate (hack/lint.sh) first: it fails early, and takes about a
# minute once golangci-lint is built. Not with extra arguments (a chosen
# set of tests).
if [ $# -eq 0 ]; then
	tl=$SECONDS
	bash hack/lint.sh
	echo "lint: $((SECONDS - tl))s"
fi

t0=$SECONDS
bash hack/install-test-deps.sh
t1=$SECONDS
export KUBE_BIND_TEST_BINARIES
KUBE_BIND_TEST_BINARIES=$(bash hack/install-test-binaries.sh | tail -n 1)
t2=$SECONDS
echo "test dependencies: $((t1 - t0))s; test binaries: $((t2 - t1))s ($KUBE_BIND_TEST_BINARIES)"

# The released kube-bind binaries (v0.4.8 and v0.8.2) the consumer-side
# tests run: $KUBE_BIND_TEST_PEERS, else peers/ in the checkout
# (internal/localenv/konnector).

# The tests that drop packets with nft (test/replicas) run as root here
# with nftables installed: where they cannot, they fail instead of skipping.
# So do the tests on the one-node cluster (test/node).
if [ "$(id -u)" -eq 0 ]; then
	export KUBE_BIND_TEST_REQUIRE_NFT=1 KUBE_BIND_TEST_REQUIRE_NODE=1
fi

# Screenshots and other artefacts of the tests land here.
export KUBE_BIND_TEST_ARTIFACTS="${KUBE_BIND_TEST_ARTIFACTS:-$PWD/_artifacts}"

# -p 1: the machine has 2 cores and several packages start a control plane.
if [ $# -gt 0 ]; then
	exec go test -race -p 1 -timeout 40m -count=1 "$@"
fi
go test -race -p 1 -timeout 40m -count=1 ./...
t3=$SECONDS
# Each fuzz target for FUZZTIME (default 5s); about two minutes in all.
bash hack/fuzz.sh
echo "go test: $((t3 - t2))s; fuzzing: $((SECONDS - t3))s"
