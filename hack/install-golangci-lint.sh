#!/usr/bin/env bash
# Builds the pinned golangci-lint from the Go module proxy, once, into
# $HOME/.cache/kube-bind-backend/golangci-lint-<version>/, and prints the
# binary's path as its last line of stdout. A second call returns at once.
# It is built outside our go.mod so its dependencies never enter ours.
#
# Environment: GOLANGCI_LINT_VERSION (pin), KUBE_BIND_BACKEND_CACHE
# (cache root, default $HOME/.cache/kube-bind-backend).
set -euo pipefail

GOLANGCI_LINT_VERSION="${GOLANGCI_LINT_VERSION:-v2.15.0}"
cache_root="${KUBE_BIND_BACKEND_CACHE:-$HOME/.cache/kube-bind-backend}"
dest="$cache_root/golangci-lint-${GOLANGCI_LINT_VERSION}"
bin="$dest/golangci-lint"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

echo "[install-golangci-lint] building golangci-lint $GOLANGCI_LINT_VERSION into $dest" >&2
mkdir -p "$cache_root"
# Built into a temporary folder and moved into place, so an interrupted
# build never leaves a folder that looks complete.
tmp=$(mktemp -d "$cache_root/.golangci-lint-${GOLANGCI_LINT_VERSION}.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# GOFLAGS=-mod=mod: outside any module's vendor settings; GOWORK=off: never
# a workspace of the caller's.
(cd "$tmp" && GOWORK=off GOFLAGS=-mod=mod GOBIN="$tmp" nice -n 10 \
  go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@${GOLANGCI_LINT_VERSION}")
mkdir -p "$dest"
mv "$tmp/golangci-lint" "$bin"
echo "$bin"
