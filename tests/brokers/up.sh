#!/usr/bin/env bash
# Start the test brokers (Kafka on 127.0.0.1:9092, RabbitMQ on 127.0.0.1:5672)
# in parallel; idempotent. Exits non-zero if either fails to come up.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

"$DIR/kafka.sh" start & kpid=$!
"$DIR/rabbitmq.sh" start & rpid=$!
krc=0; rrc=0
wait "$kpid" || krc=$?
wait "$rpid" || rrc=$?
if (( krc != 0 || rrc != 0 )); then
  echo "[brokers] FAILED (kafka rc=$krc, rabbitmq rc=$rrc)" >&2
  exit 1
fi
echo "[brokers] up: kafka 127.0.0.1:9092, rabbitmq 127.0.0.1:5672"
