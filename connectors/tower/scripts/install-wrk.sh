#!/usr/bin/env bash
# Installs `wrk` (Debian's package), the load generator of the overload run in load.sh.
# Idempotent: installs only when missing. Needs root for apt-get (as tests/tools.sh does for
# promtool).
set -euo pipefail

say() { echo "[wrk] $*"; }
die() { echo "[wrk] error: $*" >&2; exit 1; }

if command -v wrk >/dev/null 2>&1; then
  say "$(wrk --version 2>&1 | head -n 1)"
  exit 0
fi
[[ "$(id -u)" = 0 ]] || die "wrk is missing and installing it (apt-get install wrk) needs root"
LOG="$(mktemp)"
say "installing Debian's wrk package (one-time)..."
{
  # Another apt-get (a broker script, tests/tools.sh) may hold the dpkg lock: wait for it.
  apt-get -o DPkg::Lock::Timeout=300 update -q &&
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends wrk
} >"$LOG" 2>&1 </dev/null || { tail -n 30 "$LOG" >&2; die "apt-get install wrk failed"; }
command -v wrk >/dev/null 2>&1 || die "wrk installed but not on PATH"
say "installed $(dpkg-query -W -f='${Version}' wrk 2>/dev/null || echo '?')"
