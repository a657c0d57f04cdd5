#!/usr/bin/env bash
# Runs the whole test suite against real parts: it installs what a fresh
# machine lacks (the pinned Kubernetes binaries and helm, chromium, the test
# OpenID Connect provider's npm packages), then runs go test with -race:
# the packages that start real parts from a queue in two lanes (three
# once fuzzing is done), and beside them the others several at a time,
# then every fuzz target for a few seconds (hack/fuzz.sh). At the end it prints the packages' times, slowest first
# (docs/testing.md). Extra arguments go to go test (default: ./...); with
# them, only go test runs (no fuzzing).
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

if [ $# -gt 0 ]; then
	exec go test -race -p 1 -timeout 40m -count=1 "$@"
fi
mkdir -p "$KUBE_BIND_TEST_ARTIFACTS"

# go test's own vet pass is a part of golangci-lint's govet, which the
# lint gate above ran on every package and its tests; and the test
# binaries need no DWARF (stack traces and race reports come from the
# symbol table Go keeps anyway), and linking without it takes less CPU,
# for about a hundred links.
test_flags=(-vet=off -ldflags=-w)

work=$(mktemp -d)
background=()
cleanup() {
	for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait || true
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/bin/" ./hack/testreport

# The packages whose tests start a real part (a control plane, a node, a
# konnector, the identity provider, a browser) are those whose test
# binaries import one of these packages; each part refuses to start in the
# others, the parallel set (procs.ParallelSetEnv).
module=$(go list -m)
real_parts="^$module/(internal/localenv/(controlplane|node|konnector|oidcprovider)|internal/testutil/chromium)\$"
mapfile -t all < <(go list ./...)
mapfile -t with_parts < <(go list -test -f '{{$p := .ImportPath}}{{range .Deps}}{{$p}} {{.}}{{"\n"}}{{end}}' ./... |
	awk -v re="$real_parts" '$1 ~ /\.test$/ && $2 ~ re { print substr($1, 1, length($1) - 5) }' | sort -u)
# The queue of the packages with real parts starts with the slowest ones,
# so that the last minutes are not one long package alone: by the seconds
# each took in this machine's last full run (kept in $times), else by the
# list slow_first (from the per-package tables of earlier CI runs). A
# package with no record yet goes before those with one: it may be slow.
times="${XDG_CACHE_HOME:-$HOME/.cache}/kube-bind-backend/package-seconds"
slow_first=(test/replicas test/e2e test/scale internal/binding/controllers/credentials test/node test/v2 test/consumer test/chart test/kbindcli hack/demo test/upgrade)
mapfile -t cluster < <(
	for p in "${with_parts[@]}"; do
		rel=${p#"$module"/}
		seconds=$(awk -v p="$rel" '$1 == p { print $2 }' "$times" 2>/dev/null || true)
		if [ -z "$seconds" ]; then
			seconds=5000
			for i in "${!slow_first[@]}"; do
				if [ "${slow_first[$i]}" = "$rel" ]; then seconds=$((10000 - i)); fi
			done
		fi
		printf '%s %s\n' "$seconds" "$p"
	done | sort -s -k1,1nr | cut -d' ' -f2
)
if [ "${#cluster[@]}" -ne "${#with_parts[@]}" ]; then
	echo "hack/test.sh: the queue holds ${#cluster[@]} of the ${#with_parts[@]} packages with real parts" >&2
	exit 1
fi
parallel=()
for p in "${all[@]}"; do
	if ! printf '%s\n' "${with_parts[@]}" | grep -qx "$p"; then parallel+=("$p"); fi
done
lanes=${KUBE_BIND_TEST_CLUSTER_PACKAGES:-2}
lanes_after_fuzz=${KUBE_BIND_TEST_LANES_AFTER_FUZZ:-1}
echo "go test: ${#cluster[@]} packages with real parts, $lanes at a time, $((lanes + lanes_after_fuzz)) once fuzzing is done; beside them ${#parallel[@]} without, then every fuzz target"

# The packages with real parts run from a queue, in lanes: each lane
# takes the next package when its last one is done (go test -json, one
# package at a time) and prints its output in one piece under a lock.
# Their events are kept per package and joined at the end.
queue="$work/queue"
printf '%s\n' "${cluster[@]}" >"$queue"
mkdir -p "$work/events"
next_package() {
	flock "$queue.lock" bash -c 'head -n 1 "$1" && sed -i 1d "$1"' _ "$queue"
}
cluster_lane() {
	local pkg events started lane_rc=0
	while pkg=$(next_package) && [ -n "$pkg" ]; do
		events="$work/events/$(printf '%s' "${pkg#"$module"/}" | tr '/.' '__').json"
		started=$SECONDS
		go test -race "${test_flags[@]}" -timeout 40m -count=1 -json "$pkg" >"$events" 2>&1 || lane_rc=1
		echo "${pkg#"$module"/} $((SECONDS - started))" >>"$work/seconds"
		flock "$work/print.lock" "$work/bin/testreport" -follow <"$events" || lane_rc=1
	done
	return $lane_rc
}

# The backend and the client, built once for every package that runs them
# as processes (internal/localenv/procs.Build takes them from these
# variables instead of linking its own); the lanes start once they are.
backend_binaries=(KUBE_BIND_TEST_BACKEND_BINARY="$work/bin/backend" KUBE_BIND_TEST_POLL_BINARY="$work/bin/kube-bind-poll")

# Beside the packages with real parts, which mostly wait for their
# processes: the packages without (several at a time), then fuzzing (each
# target still for FUZZTIME), whose output is shown once they are done;
# then this becomes $lanes_after_fuzz more lane(s) of packages with real
# parts: while the parallel set and fuzzing run, they keep both cores
# busy, and after them two lanes alone use about half of them.
# go test -json keeps each package's events (the per-package times of the
# table) in the artefacts; testreport -follow prints the usual output.
t3=$SECONDS
(
	rc=0
	KUBE_BIND_TEST_PARALLEL_SET=1 go test -race "${test_flags[@]}" -p 2 -timeout 20m -count=1 -json "${parallel[@]}" |
		"$work/bin/testreport" -follow -save "$KUBE_BIND_TEST_ARTIFACTS/go-test-parallel.json" >"$work/parallel.log" 2>&1 || rc=1
	echo $((SECONDS - t3)) >"$work/parallel.time"
	bash hack/fuzz.sh >"$work/fuzz.log" 2>&1 || rc=1
	echo $((SECONDS - t3)) >"$work/fuzz.time"
	while [ ! -e "$work/built" ]; do sleep 1; done
	export "${backend_binaries[@]}"
	after_fuzz=()
	for _ in $(seq "$lanes_after_fuzz"); do
		cluster_lane &
		after_fuzz+=($!)
	done
	for pid in "${after_fuzz[@]}"; do wait "$pid" || rc=1; done
	echo $((SECONDS - t3)) >>"$work/lanes.time"
	exit $rc
) &
background+=($!)

tb=$SECONDS
go build -o "$work/bin/" ./cmd/backend ./cmd/kube-bind-poll
export "${backend_binaries[@]}"
touch "$work/built"
echo "built the backend and kube-bind-poll for the tests: $((SECONDS - tb))s"

rc=0
lane_pids=()
for _ in $(seq "$lanes"); do
	cluster_lane &
	lane_pids+=($!)
	background+=($!)
done
for pid in "${lane_pids[@]}"; do wait "$pid" || rc=1; done
echo $((SECONDS - t3)) >>"$work/lanes.time"
wait "${background[0]}" || rc=1
background=()
t5=$((t3 + $(sort -n "$work/lanes.time" | tail -n 1)))
cat "$work/events/"*.json >"$KUBE_BIND_TEST_ARTIFACTS/go-test-real-parts.json"
# This run's seconds replace the recorded ones, package by package.
mkdir -p "$(dirname "$times")"
{
	cat "$times" 2>/dev/null || true
	cat "$work/seconds"
} | awk '{ t[$1] = $2 } END { for (p in t) print p, t[p] }' | sort >"$times.new"
mv "$times.new" "$times"
echo
echo "=== go test of the packages without real parts (done $(cat "$work/parallel.time")s after the start of go test)"
cat "$work/parallel.log"
echo
echo "=== fuzzing (done $(cat "$work/fuzz.time" 2>/dev/null || echo -)s after the start of go test)"
cat "$work/fuzz.log" 2>/dev/null || true

echo
"$work/bin/testreport" "$KUBE_BIND_TEST_ARTIFACTS/go-test-parallel.json" "$KUBE_BIND_TEST_ARTIFACTS/go-test-real-parts.json" || rc=1
echo "go test with real parts: $((t5 - t3))s; without: $(cat "$work/parallel.time")s, then fuzzing until $(cat "$work/fuzz.time" 2>/dev/null || echo -)s; in all $((SECONDS - t0))s"
exit $rc
