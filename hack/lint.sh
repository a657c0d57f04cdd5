#!/usr/bin/env bash
# The lint gate: golangci-lint (pinned, built once by
# hack/install-golangci-lint.sh) with .golangci.yml, then the checks that
# are assertions on the build graph. Extra arguments go to golangci-lint run
# (default: ./...).
set -euo pipefail
cd "$(dirname "$0")/.."

lint=$(bash hack/install-golangci-lint.sh | tail -n 1)
nice -n 10 "$lint" run "${@:-./...}"

# The local demo links internal/localenv; the test helpers there take a
# tb.TB so that package testing stays out of the demo binary.
if go list -deps ./hack/demo | grep -qx testing; then
  echo "hack/lint.sh: hack/demo links package testing; find the importer with:" >&2
  echo "  go list -f '{{.ImportPath}}: {{.Imports}}' \$(go list -deps ./hack/demo) | grep -w testing" >&2
  exit 1
fi

# A merge whose conflicts were committed unresolved can still build (the
# markers may sit in docs or test data); refuse it here.
if git rev-parse --git-dir >/dev/null 2>&1 && git grep -nE '^(<<<<<<<|>>>>>>>) ' -- . >&2; then
  echo "hack/lint.sh: unresolved merge conflict markers (above)" >&2
  exit 1
fi
