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
