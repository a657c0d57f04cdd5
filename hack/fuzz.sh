#!/usr/bin/env bash
# Runs every fuzz target of the module for a short, fixed time (CI) or as
# long as you like, one worker each, and prints a table of what each did.
# Fails if any target fails; the failing input is then saved under the
# package's testdata/fuzz/<Target>/ (commit it: it becomes a seed that
# go test runs every time).
#
#   hack/fuzz.sh                      # every target, FUZZTIME each (default 5s)
#   FUZZTIME=10m FUZZ_CORPUS=keep hack/fuzz.sh   # the long run (docs/fuzzing.md)
#   FUZZ_MATCH='Peer|Seal' hack/fuzz.sh   # only targets whose name matches
#   FUZZ_LOG_DIR=/tmp/fuzzlogs hack/fuzz.sh  # keep each target's output
#
# Each package's fuzz test binary is built once (go test -c -fuzz=., the
# build go test -fuzz makes), its targets are listed from it (-test.list
# '^Fuzz', as go test -list does) and each target is run with the flags go
# test -run '^$' -fuzz '^Name$' -fuzztime FUZZTIME -parallel 1 passes, in
# the package's folder, with go test's fuzz cache. Building once instead of
# once per target saves a link of a large binary per target; linking
# without DWARF (-ldflags=-w, which a crash's stack trace does not need)
# makes each link cheaper, and vet (-vet=off) is go test's and the lint
# gate's job, not fuzzing's. BUILD(s) in
# the table is the build of the target's package (shown on its first
# target), which overlaps with fuzzing the package before.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-5s}"
FUZZ_MATCH="${FUZZ_MATCH:-.}"
# Minimizing every input that adds coverage (go's default: up to 60s each)
# would eat a short run; long runs may set FUZZMINIMIZETIME=60s.
FUZZMINIMIZETIME="${FUZZMINIMIZETIME:-0}"
# The corpus a target grows is kept in go test's fuzz cache, and every run
# first replays all of it ("gathering baseline coverage"): after a few long
# runs that alone takes longer than a short run, which then fuzzes nothing.
# So a short run (the default) starts from the seed corpus in a corpus of
# its own; FUZZ_CORPUS=keep (for long runs) uses and grows go test's cache.
fresh_cache=
if [ "${FUZZ_CORPUS:-fresh}" = keep ]; then
	cache="$(go env GOCACHE)/fuzz"
else
	cache=$(mktemp -d)
	fresh_cache=$cache
fi
work=$(mktemp -d)
builder=
cleanup() {
	# Under set -e a failing command here would become the exit status.
	if [ -n "$builder" ]; then kill "$builder" 2>/dev/null || true; fi
	wait || true
	rm -rf "$work" ${fresh_cache:+"$fresh_cache"}
}
trap cleanup EXIT

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Packages with fuzz targets: a target lives in a _test.go file as
# func FuzzXxx(f *testing.F).
mapfile -t dirs < <(git ls-files --cached --others --exclude-standard -- '*_test.go' |
	xargs -r grep -lE '^func Fuzz[A-Z0-9_]' | xargs -r -n1 dirname | sed 's|^|./|' | sort -u)
if [ ${#dirs[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi

# Build every package's binary in the background, in order, while the
# targets of the packages built before are fuzzed: builds and fuzzing
# overlap on the two cores instead of adding up.
bin_of() { echo "$work/$(echo "$1" | tr '/.' '__').test"; }
(
	for dir in "${dirs[@]}"; do
		bin=$(bin_of "$dir")
		t0=$(now)
		if go test -c -fuzz=. -vet=off -ldflags=-w -o "$bin" "$dir" >"$bin.log" 2>&1; then
			since "$t0" >"$bin.time" && mv "$bin.time" "$bin.built"
		else
			touch "$bin.failed"
		fi
	done
) &
builder=$!

rows=()
failed=()
total_start=$(now)
for dir in "${dirs[@]}"; do
	pkg=$(go list "$dir")
	bin=$(bin_of "$dir")
	while [ ! -e "$bin.built" ] && [ ! -e "$bin.failed" ]; do sleep 0.2; done
	if [ -e "$bin.failed" ]; then
		cat "$bin.log" >&2
		failed+=("$pkg (build)")
		continue
	fi
	build=$(cat "$bin.built")
	mapfile -t targets < <(cd "$dir" && "$bin" -test.list '^Fuzz' | grep -E '^Fuzz' | grep -E -- "$FUZZ_MATCH" || true)
	first=1
	for target in "${targets[@]}"; do
		log="$work/$target.log"
		t1=$(now)
		rc=0
		fuzz_once() {
			(cd "$dir" && "$bin" -test.run='^$' -test.fuzz="^${target}\$" -test.fuzztime="$FUZZTIME" -test.parallel=1 \
				-test.fuzzminimizetime="$FUZZMINIMIZETIME" -test.timeout=0 -test.fuzzcachedir="$cache/$pkg") >"$log" 2>&1
		}
		fuzz_once || rc=$?
		# The fuzzing engine itself sometimes ends a short run with a bare
		# "context deadline exceeded" (its deadline struck a worker between
		# inputs): no input failed, none was written. That is run once
		# more; a real finding always writes its input and fails.
		if [ $rc -ne 0 ] && ! grep -q 'Failing input written' "$log" &&
			grep -qx '    context deadline exceeded' "$log"; then
			echo "fuzz: $target: the engine's deadline struck between inputs (no failing input); running it again" >&2
			rc=0
			fuzz_once || rc=$?
		fi
		ran=$(since "$t1")
		if [ -n "${FUZZ_LOG_DIR:-}" ]; then mkdir -p "$FUZZ_LOG_DIR" && cp "$log" "$FUZZ_LOG_DIR/"; fi
		# The last progress line has the totals.
		last=$(grep -E '^fuzz: elapsed' "$log" | tail -n 1 || true)
		execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
		interesting=$(sed -nE 's/.*new interesting: ([0-9]+).*/\1/p' <<<"$last")
		result=ok
		if [ $rc -ne 0 ]; then
			result=FAIL
			failed+=("$target ($pkg)")
			echo "--- $target ($pkg) failed:" >&2
			grep -vE '^fuzz: elapsed' "$log" >&2 || true
		fi
		compile="-"
		if [ $first -eq 1 ]; then compile=$build; first=0; fi
		rows+=("$(printf '%-30s %-44s %8s %7s %12s %12s  %s' "$target" "${pkg#github.com/kbprovider/backend/}" "$compile" "$ran" "${execs:-0}" "${interesting:-0}" "$result")")
	done
done
wait "$builder"

printf '\n%-30s %-44s %8s %7s %12s %12s  %s\n' TARGET PACKAGE "BUILD(s)" "RUN(s)" EXECS "NEW-INTEREST" RESULT
printf '%s\n' "${rows[@]}"
echo "fuzz: ${#rows[@]} targets, ${FUZZTIME} each, $(since "$total_start")s in all (builds included)"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'fuzz: FAILED: %s\n' "${failed[@]}" >&2
	echo "fuzz: failing inputs are saved under the package's testdata/fuzz/<Target>/; go test -run '<Target>/<file>' ./<package> replays one" >&2
	exit 1
fi
