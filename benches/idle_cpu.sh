#!/usr/bin/env bash
# CPU an idle worker uses: starts the Kafka worker example on a new, empty topic (brokers up:
# tests/brokers/up.sh), lets it settle for 8 s, then reads its CPU time (user + system, every
# thread, from /proc) over the next 10 s, in all and per thread name.
#
#   benches/idle_cpu.sh            # builds the example in release first
#
# Figures in BENCHMARKS.md ("An idle worker's CPU").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release -q -p triage-kafka --example kafka_worker
bin=target/release/examples/kafka_worker
"$bin" --topic "idle-$RANDOM$RANDOM" --duration-s 25 --quiet >/dev/null 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
tick=$(getconf CLK_TCK)
snap() {
    for t in /proc/"$pid"/task/*; do
        echo "$(basename "$t") $(awk '{print $14+$15}' "$t/stat") $(tr ' ' _ <"$t/comm")"
    done | sort
}
sleep 8
snap >/tmp/idle_cpu.1
sleep 10
snap >/tmp/idle_cpu.2
join /tmp/idle_cpu.1 /tmp/idle_cpu.2 | awk -v tick="$tick" '
    { d = ($4 - $2) * 1000 / tick / 10; total += d; if (d > 0) by[$3] += d }
    END {
        printf "idle CPU: %.0f ms per second (of one core), %d threads\n", total, NR
        for (n in by) printf "  %6.0f ms/s  %s\n", by[n], n
    }' | sort -k1,1r
