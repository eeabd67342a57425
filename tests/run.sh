#!/usr/bin/env bash
# README's test command: brings up what the tests need (Apache Kafka in KRaft mode from the
# Maven Central jars, Debian's RabbitMQ; both installed by the scripts when missing), installs
# promtool (Debian's prometheus package) when missing, and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.cargo/bin:$PATH"
tests/tools.sh
# The tests that need promtool skip themselves when it is missing (a contributor's first
# `cargo test -p triage`); here it is installed, and a missing one is a failure.
export TRIAGE_REQUIRE_TOOLS=1
tests/brokers/up.sh
# Every test binary runs even after a failure, so one run shows every failing test.
cargo test --workspace --all-features --no-fail-fast
# The API documentation of every crate builds without a warning (broken intra-doc links, bad
# code blocks, missing docs), as docs.rs would build it: the workspace's crates only.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
# The loom models of the waiter protocols (tests/loom_queue.rs), of the token buckets
# (tests/loom_bucket.rs) and of the memory budget's counts (tests/loom_memory.rs) are opt-in:
# `--cfg loom` rebuilds every dependency in a target directory of its own (about 10 minutes the
# first time on 2 cores; the models run in about a minute), which would push the suite past its
# 30-minute budget on a fresh machine. TRIAGE_LOOM=1 runs them after the suite.
if [[ "${TRIAGE_LOOM:-0}" == 1 ]]; then
    RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom timeout 1800 \
        cargo test --test loom_queue --test loom_bucket --test loom_memory --release
    # The clock upkeep's park/wake protocol (src/queue/time.rs), a crate-private model.
    RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom timeout 900 \
        cargo test --lib --release queue::time::loom_tests
fi
