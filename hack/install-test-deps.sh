#!/usr/bin/env bash
# Installs what the tests need besides Go binaries: Debian's chromium for
# browser tests and the npm packages of the test OpenID Connect provider.
# Returns quickly when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd=sudo
  $sudo_cmd apt-get update -qq >/dev/null
  $sudo_cmd apt-get install -y -qq chromium >/dev/null
fi

for dir in test/oidcprovider; do
  if [ -f "$dir/package-lock.json" ]; then
    if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
      echo "npm ci in $dir" >&2
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    fi
  fi
done
