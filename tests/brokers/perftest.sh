#!/usr/bin/env bash
# RabbitMQ's own load tool, PerfTest (com.rabbitmq:perf-test from Maven Central, run with the
# machine's Java), against the broker of tests/brokers/rabbitmq.sh: what the broker itself
# carries on this machine, with no triage code involved.
#
#   tests/brokers/perftest.sh fetch          fetch the jars (once; cached in .cache/perftest-libs)
#   tests/brokers/perftest.sh [PerfTest args] run PerfTest against amqp://guest:guest@127.0.0.1:5672
#
# Example, the proving ground's publishing pattern (persistent 256-byte messages, publisher
# confirms, one consumer acking), at a fixed rate for 20 s:
#
#   tests/brokers/perftest.sh --producers 1 --consumers 1 --flag persistent --confirm 1000 \
#     --size 256 --rate 7000 --qos 1000 --multi-ack-every 100 --time 20 --queue perftest
#
# Env override: PERFTEST_VERSION (default 2.22.1).
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="$DIR/.cache"
# shellcheck source=tests/brokers/maven.sh
source "$DIR/maven.sh"
LIBS="$CACHE/perftest-libs"
VERSION="${PERFTEST_VERSION:-2.22.1}"
URI="amqp://guest:guest@127.0.0.1:5672"

say() { echo "[perftest] $*" >&2; }
die() { echo "[perftest] ERROR: $*" >&2; exit 1; }

fetch() {
  if [[ -f "$LIBS/.complete" && "$(cat "$LIBS/.complete")" = "$VERSION" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (need Maven to fetch PerfTest)"
  command -v java >/dev/null || die "java not found"
  say "fetching PerfTest $VERSION from Maven Central (mvn copy-dependencies)..."
  if ! maven_fetch "$CACHE/perftest-fetch" "$LIBS" perftest-libs "com.rabbitmq:perf-test:$VERSION" \
    || ! compgen -G "$LIBS.tmp/perf-test-$VERSION.jar" >/dev/null; then
    rm -rf "$LIBS.tmp"
    die "could not fetch PerfTest $VERSION"
  fi
  rm -rf "$LIBS"
  mv "$LIBS.tmp" "$LIBS"
  echo "$VERSION" >"$LIBS/.complete"
  say "PerfTest $VERSION: $(find "$LIBS" -name '*.jar' | wc -l) jars in $LIBS"
}

case "${1:-}" in
  fetch) fetch ;;
  *)
    fetch
    exec java -cp "$LIBS/*" com.rabbitmq.perf.PerfTest --uri "$URI" "$@"
    ;;
esac
