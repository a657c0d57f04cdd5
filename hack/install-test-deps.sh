#!/usr/bin/env bash
# Installs what the tests need besides the Go-built binaries
# (hack/install-test-binaries.sh): Debian's chromium for the browser tests,
# nftables for the tests that drop a replica's packets, containerd, runc and
# the CNI plugins for the one-node cluster (internal/localenv/node), and
# the npm packages of the test OpenID Connect provider (npm ci, from its lock
# file). Returns at once when everything is already there.
#
#   hack/install-test-deps.sh               chromium and npm ci
#   hack/install-test-deps.sh --no-browser  npm ci only (the local demo, hack/demo.sh)
#   hack/install-test-deps.sh --no-browser --node
#                                           and the node's runtime (hack/demo.sh --node)
set -euo pipefail
cd "$(dirname "$0")/.."

browser=yes
node=""
for arg in "$@"; do
  case "$arg" in
    --no-browser) browser=no ;;
    --node) node=yes ;;
    *) echo "usage: $0 [--no-browser] [--node]" >&2; exit 2 ;;
  esac
done

log() { printf '[install-test-deps %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# apt_install PACKAGE...: from Debian's packages, as root or with sudo.
apt_install() {
  log "installing $* from Debian's packages"
  local sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "$@" >/dev/null
}

if [ "$browser" = yes ] && [ ! -x /usr/bin/chromium ]; then
  apt_install chromium
  log "installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
fi

# nftables: the replica tests drop a replica's packets (timeouts, not
# refusals) with rules on loopback addresses only.
if [ "$browser" = yes ] && ! command -v nft >/dev/null 2>&1; then
  apt_install nftables
fi

# The one-node cluster's runtime (test/node, hack/demo.sh --node): Debian's
# containerd 1.6, runc and CNI plugins (bridge, host-local, loopback).
if [ "$browser" = yes ] || [ "$node" = yes ]; then
  node_pkgs=()
  command -v containerd >/dev/null 2>&1 || node_pkgs+=(containerd)
  command -v runc >/dev/null 2>&1 || node_pkgs+=(runc)
  [ -x /usr/lib/cni/bridge ] || node_pkgs+=(containernetworking-plugins)
  command -v nft >/dev/null 2>&1 || node_pkgs+=(nftables)
  if [ ${#node_pkgs[@]} -gt 0 ]; then
    apt_install "${node_pkgs[@]}"
  fi
fi

for dir in test/oidcprovider; do
  [ -f "$dir/package-lock.json" ] || continue
  if ! command -v npm >/dev/null 2>&1; then
    log "npm is missing: install Node.js 20 or newer with npm, then run this script again"
    exit 1
  fi
  # npm ci only when node_modules is missing or older than the lock file.
  if [ ! -f "$dir/node_modules/.package-lock.json" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
    log "npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  fi
done
