#!/usr/bin/env bash
# README's test command: brings up what the tests need (Apache Kafka in KRaft mode from the
# Maven Central jars, Debian's RabbitMQ; both installed by the scripts when missing), installs
# promtool (Debian's prometheus package) when missing, and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
tests/tools.sh
tests/brokers/up.sh
cargo test --workspace --all-features
# The loom models of the waiter protocols (tests/loom_queue.rs), in their own target directory
# since `--cfg loom` rebuilds every dependency (about 10 minutes the first time on 2 cores; the
# models themselves run in about a minute). TRIAGE_SKIP_LOOM=1 skips them.
if [[ "${TRIAGE_SKIP_LOOM:-0}" != 1 ]]; then
    RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom timeout 1800 \
        cargo test --test loom_queue --release
fi
