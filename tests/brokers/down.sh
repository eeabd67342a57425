#!/usr/bin/env bash
# Stop the test brokers; their data is kept (use kafka.sh/rabbitmq.sh reset to wipe).
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

rc=0
"$DIR/kafka.sh" stop || rc=1
"$DIR/rabbitmq.sh" stop || rc=1
exit "$rc"
