#!/usr/bin/env bash
# Tools the test suite calls besides cargo: `promtool` (Debian's `prometheus` package), which
# checks a scrape of the metrics endpoint (`promtool check metrics`) and the rules in deploy/
# (`promtool check rules`, `promtool test rules`). Idempotent: installs only what is missing.
#
# Needs root for apt-get. The package's postinst is kept from starting the Prometheus service
# (policy-rc.d 101): the tests only need the binaries.
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="$DIR/brokers/.cache"

say() { echo "[tools] $*"; }
die() { echo "[tools] error: $*" >&2; exit 1; }

if command -v promtool >/dev/null 2>&1; then
  say "promtool: $(promtool --version 2>&1 | head -n 1)"
  exit 0
fi

[[ "$(id -u)" = 0 ]] || die "promtool is missing and installing it (apt-get install prometheus) needs root"
mkdir -p "$CACHE"
say "installing Debian's prometheus package for promtool (one-time)..."
made_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  made_policy=1
fi
rc=0
{
  # Another apt-get (a broker script) may hold the dpkg lock: wait for it.
  apt-get -o DPkg::Lock::Timeout=300 update -q &&
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends -o Dpkg::Options::=--force-confdef \
    -o Dpkg::Options::=--force-confold prometheus
} >"$CACHE/prometheus-install.log" 2>&1 </dev/null || rc=$?
if (( made_policy )); then rm -f /usr/sbin/policy-rc.d; fi
if (( rc != 0 )); then
  tail -n 30 "$CACHE/prometheus-install.log" >&2
  die "apt-get install prometheus failed (rc $rc)"
fi
command -v promtool >/dev/null 2>&1 || die "prometheus installed but promtool is not on PATH"
say "installed prometheus $(dpkg-query -W -f='${Version}' prometheus 2>/dev/null || echo '?'): $(promtool --version 2>&1 | head -n 1)"
