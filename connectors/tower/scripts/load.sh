#!/usr/bin/env bash
# Reproduces triage-tower's overload figures in BENCHMARKS.md: the service example
# (examples/http_service.rs) loaded by wrk (Debian's package, installed by install-wrk.sh)
# through mix.lua, then the retry-reappearance ratio with load_client twice (clients that retry
# at once, then the crate's retry policy). Loopback only; every phase is bounded in time.
#
#   connectors/tower/scripts/load.sh [OUT_FILE]
#
# Environment: SERVICE_MS (10), CAPACITY slots (8), FACTOR (3), DURATION_S per phase (20),
# CONNECTIONS for wrk (600), PORT (18080). About 2.5 minutes plus the release build.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
OUT="${1:-$HERE/load-$(date -u +%Y%m%dT%H%M%SZ).txt}"
SERVICE_MS="${SERVICE_MS:-10}"
CAPACITY="${CAPACITY:-8}"
FACTOR="${FACTOR:-3}"
DURATION_S="${DURATION_S:-20}"
CONNECTIONS="${CONNECTIONS:-600}"
PORT="${PORT:-18080}"
URL="http://127.0.0.1:$PORT/work"

"$HERE/install-wrk.sh"
cd "$ROOT"
cargo build --release -q -p triage-tower --example http_service --example load_client
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples"

log() { echo "$*" | tee -a "$OUT"; }
: >"$OUT"
log "# triage-tower load run, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
log "# service ${SERVICE_MS} ms, ${CAPACITY} slots, factor ${FACTOR}, ${DURATION_S} s phases; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

SERVER_PID=""
serve() { # serve SECONDS -> starts the service in the background, output to $1.log
  "$BIN/http_service" --addr "127.0.0.1:$PORT" --service-ms "$SERVICE_MS" \
    --capacity "$CAPACITY" --duration-s "$1" --quiet >"$2" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/healthz" && return 0
    sleep 0.1
  done
  echo "service did not start" >&2; cat "$2" >&2; exit 1
}
stop() { wait "$SERVER_PID" || true; }
trap '[[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null || true' EXIT
TMP="$(mktemp -d)"

# 1. Capacity: Critical only, 32 connections, no pacing: every request is served.
serve 13 "$TMP/cap.log"
wrk -t2 -c32 -d10s -s "$HERE/mix.lua" "$URL" -- 0 critical >"$TMP/cap.wrk"
stop
CAP="$(awk '/^Requests\/sec:/ {printf "%d", $2}' "$TMP/cap.wrk")"
log ""
log "## capacity (Critical only, 32 connections): ${CAP} req/s"
grep -E "^critical|Requests/sec" "$TMP/cap.wrk" | tee -a "$OUT"
TARGET=$(( CAP * FACTOR ))

# 2. Overload at FACTOR x capacity: pace each connection by delay() so that
#    CONNECTIONS / (delay + mean answer time) = TARGET; one 5 s calibration for the answer time.
DELAY=$(( CONNECTIONS * 1000 / TARGET ))
serve 8 "$TMP/calib.log"
wrk -t2 -c"$CONNECTIONS" -d5s -s "$HERE/mix.lua" "$URL" -- "$DELAY" >"$TMP/calib.wrk"
stop
RATE0="$(awk '/^Requests\/sec:/ {printf "%d", $2}' "$TMP/calib.wrk")"
# mean answer time r = C / R0 - d0 (ms); d1 = C / TARGET - r
DELAY=$(awk -v c="$CONNECTIONS" -v r0="$RATE0" -v d0="$DELAY" -v t="$TARGET" \
  'BEGIN { r = c * 1000 / r0 - d0; d = c * 1000 / t - r; if (d < 0) d = 0; printf "%d", d }')
serve $(( DURATION_S + 3 )) "$TMP/over.log"
wrk -t2 -c"$CONNECTIONS" -d"${DURATION_S}s" --latency -s "$HERE/mix.lua" "$URL" -- "$DELAY" >"$TMP/over.wrk"
stop
OFFERED="$(awk '/^Requests\/sec:/ {printf "%d", $2}' "$TMP/over.wrk")"
log ""
log "## overload: offered ${OFFERED} req/s = $(awk -v o="$OFFERED" -v c="$CAP" 'BEGIN {printf "%.2f", o / c}')x capacity (target ${TARGET}; wrk ${CONNECTIONS} connections, delay ${DELAY} ms)"
log "### wrk"
cat "$TMP/over.wrk" | tee -a "$OUT"
log "### the service"
cat "$TMP/over.log" | tee -a "$OUT"

# 3. The retry-reappearance ratio: the same offered rate of first attempts, twice.
for mode in immediate policy; do
  serve $(( DURATION_S + 14 )) "$TMP/ratio-$mode.log"
  "$BIN/load_client" --url "$URL" --rate "$TARGET" --duration-s "$DURATION_S" --drain-s 10 \
    --retry "$mode" --id-prefix "$mode" >"$TMP/ratio-$mode.client" 2>&1
  stop
  log ""
  log "## retries: $mode (load_client, ${TARGET} first attempts/s)"
  cat "$TMP/ratio-$mode.client" | tee -a "$OUT"
  grep -A7 "retry reappearance" "$TMP/ratio-$mode.log" | tee -a "$OUT"
  grep -E "^(critical|high|medium|sheddable) " "$TMP/ratio-$mode.log" | tee -a "$OUT"
done
rm -rf "$TMP"
log ""
log "written to $OUT"
