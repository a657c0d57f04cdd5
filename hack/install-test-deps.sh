#!/usr/bin/env bash
# Installs what the tests need besides the Go-built binaries
# (hack/install-test-binaries.sh): Debian's chromium for the browser tests,
# nftables for the tests that drop a replica's packets, and
# the npm packages of the test OpenID Connect provider (npm ci, from its lock
# file). Returns at once when everything is already there.
#
#   hack/install-test-deps.sh               chromium and npm ci
#   hack/install-test-deps.sh --no-browser  npm ci only (the local demo, hack/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

browser=yes
case "${1:-}" in
  "") ;;
  --no-browser) browser=no ;;
  *) echo "usage: $0 [--no-browser]" >&2; exit 2 ;;
esac

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
