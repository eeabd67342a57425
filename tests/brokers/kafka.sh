#!/usr/bin/env bash
# Bring up a single-node Apache Kafka 4.x broker (KRaft, broker+controller) on
# 127.0.0.1:9092 from jars fetched from Maven Central with the machine's Maven.
#
#   tests/brokers/kafka.sh [start|stop|status|reset]
#
# start  (default) fetch jars if needed, format storage once, start, wait ready.
#        Exits 0 at once if a broker already answers on 127.0.0.1:9092.
# stop   stop the broker (TERM, then KILL after a timeout); data is kept, so a
#        later start resumes with the same topics and offsets.
# status exit 0 and print "running" if the broker answers, else exit 1.
# reset  stop and wipe the data (jars are kept).
#
# The jars live in tests/brokers/.cache/ (git-ignored). The broker's state (data, log, pid,
# config) lives in one place per machine, $TRIAGE_BROKER_STATE (default
# ${TMPDIR:-/tmp}/triage-brokers/kafka), so that any checkout of the project can stop and
# restart the broker another one started (the tests restart it to test faults) without
# losing its topics.
# Env overrides: KAFKA_VERSION (default: newest of a tried list that resolves),
# KAFKA_HEAP_OPTS (default -Xms256m -Xmx1g), KAFKA_START_TIMEOUT (default 120 s).
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="$DIR/.cache"
LIBS="$CACHE/kafka-libs"
STATE="${TRIAGE_BROKER_STATE:-${TMPDIR:-/tmp}/triage-brokers}/kafka"
DATA="$STATE/kafka-data"
LOG="$STATE/kafka.log"
PIDF="$STATE/kafka.pid"
PROPS="$STATE/kafka-server.properties"
LOG4J="$STATE/kafka-log4j2.properties"
TOOLS_LOG4J="$CACHE/kafka-tools-log4j2.properties"
CLUSTER_ID_FILE="$STATE/kafka-cluster-id"
LOCK="$STATE/kafka.lock"
HOST=127.0.0.1
PORT=9092
CONTROLLER_PORT=9093
START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"
STOP_TIMEOUT=60
# Newest first; the first one that resolves with its dependencies is used.
read -r -a VERSIONS <<<"${KAFKA_VERSION:-4.4.0 4.3.1 4.2.0 4.1.1 4.0.0}"
SLF4J_VERSION=2.0.17
LOG4J_VERSION=2.24.3

say() { echo "[kafka] $*"; }
die() { echo "[kafka] ERROR: $*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# pid of our broker: from the pid file if it is still our java, else by its
# unique properties path on the command line.
broker_pid() {
  local pid
  if [[ -s "$PIDF" ]]; then
    pid="$(cat "$PIDF")"
    if [[ -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'kafka\.Kafka'; then
      echo "$pid"; return 0
    fi
  fi
  pgrep -f "kafka\.Kafka $PROPS" | head -n1 || true
}

log_tail() {
  if [[ -f "$LOG" ]]; then
    echo "----- last 60 lines of $LOG -----" >&2
    tail -n 60 "$LOG" >&2 || true
    echo "---------------------------------" >&2
  fi
}

classpath() { echo "$LIBS/*"; }

fetch_jars() {
  if [[ -f "$LIBS/.complete" ]] && compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null \
     && { [[ -z "${KAFKA_VERSION:-}" ]] || [[ "$(cat "$LIBS/.complete")" = "$KAFKA_VERSION" ]]; }; then
    say "reusing jars of Kafka $(cat "$LIBS/.complete") in $LIBS"
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (need Maven to fetch the Kafka jars)"
  command -v java >/dev/null || die "java not found"
  local v work
  for v in "${VERSIONS[@]}"; do
    say "fetching Kafka $v jars from Maven Central (mvn copy-dependencies)..."
    work="$CACHE/kafka-fetch"
    rm -rf "$work" "$LIBS.tmp"
    mkdir -p "$work"
    cat >"$work/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 http://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tests</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$v</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$v</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>3.8.1</version>
      </plugin>
    </plugins>
  </build>
</project>
EOF
    if mvn -B -q -f "$work/pom.xml" dependency:copy-dependencies \
         -DincludeScope=runtime -DoutputDirectory="$LIBS.tmp" >"$work/mvn.log" 2>&1 \
       && compgen -G "$LIBS.tmp/kafka_2.13-$v.jar" >/dev/null; then
      rm -rf "$LIBS"
      mv "$LIBS.tmp" "$LIBS"
      echo "$v" >"$LIBS/.complete"
      say "Kafka $v: $(find "$LIBS" -name '*.jar' | wc -l) jars in $LIBS"
      return 0
    fi
    say "Kafka $v did not resolve; last mvn output:"
    tail -n 15 "$work/mvn.log" >&2 || true
  done
  die "could not fetch any Kafka version of: ${VERSIONS[*]}"
}

write_config() {
  mkdir -p "$DATA"
  cat >"$PROPS" <<EOF
# Generated by tests/brokers/kafka.sh -- single-node KRaft broker+controller.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA
num.partitions=1
auto.create.topics.enable=true
delete.topic.enable=true
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
# room for 25 MB messages
message.max.bytes=31457280
replica.fetch.max.bytes=31457280
replica.fetch.response.max.bytes=62914560
socket.request.max.bytes=104857600
# small segments, short retention checks (test broker)
log.segment.bytes=67108864
log.retention.hours=24
log.retention.check.interval.ms=60000
log.cleaner.dedupe.buffer.size=16777216
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
  cat >"$LOG4J" <<'EOF'
status = warn
name = kafka-test-broker
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = WARN
EOF
  cat >"$TOOLS_LOG4J" <<'EOF'
status = warn
name = kafka-test-tools
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
}

tool_java() {
  # Run a Kafka tool class from the same jars, quietly (logs to stderr at WARN).
  java -Xmx256m -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile="$TOOLS_LOG4J" \
       -cp "$(classpath)" "$@"
}

format_storage() {
  if [[ -f "$DATA/meta.properties" ]]; then
    return 0
  fi
  local cid
  if [[ -s "$CLUSTER_ID_FILE" ]]; then
    cid="$(cat "$CLUSTER_ID_FILE")"
  else
    cid="$(tool_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1 | tr -d '[:space:]')"
    [[ -n "$cid" ]] || die "StorageTool random-uuid gave no id"
    echo "$cid" >"$CLUSTER_ID_FILE"
  fi
  say "formatting storage in $DATA (cluster id $cid)"
  tool_java kafka.tools.StorageTool format --standalone -t "$cid" -c "$PROPS" \
    >"$STATE/kafka-format.log" 2>&1 || { cat "$STATE/kafka-format.log" >&2; die "storage format failed"; }
}

# Is the broker serving requests (not only listening)?
broker_ready() {
  if compgen -G "$LIBS/kafka-tools-*.jar" >/dev/null; then
    timeout 60 java -Xmx128m -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile="$TOOLS_LOG4J" \
      -cp "$(classpath)" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "$HOST:$PORT" --list >/dev/null 2>&1
  else
    port_open "$PORT"
  fi
}

wait_ready() {
  local pid="$1" deadline=$((SECONDS + START_TIMEOUT))
  while ! port_open "$PORT"; do
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      log_tail; die "broker process $pid exited during startup"
    fi
    (( SECONDS < deadline )) || { log_tail; die "broker did not open $HOST:$PORT within ${START_TIMEOUT}s"; }
    sleep 0.5
  done
  until broker_ready; do
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      log_tail; die "broker process $pid exited during startup"
    fi
    (( SECONDS < deadline )) || { log_tail; die "broker on $HOST:$PORT not ready within ${START_TIMEOUT}s"; }
    sleep 1
  done
}

do_start() {
  local t0=$SECONDS pid
  if port_open "$PORT"; then
    pid="$(broker_pid)"
    say "already running on $HOST:$PORT${pid:+ (pid $pid)}"
    return 0
  fi
  pid="$(broker_pid)"
  if [[ -n "$pid" ]]; then
    say "broker process $pid exists but port is closed; waiting for it"
    wait_ready "$pid"
    say "ready on $HOST:$PORT (pid $pid)"
    return 0
  fi
  fetch_jars
  write_config
  format_storage
  [[ -f "$LOG" ]] && mv -f "$LOG" "$LOG.prev"
  say "starting broker (log: $LOG)"
  # setsid + nohup: own session, survives this script and its terminal/CI step.
  # shellcheck disable=SC2086
  nohup setsid java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g} \
    -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$LOG4J" \
    -Dkafka.logs.dir="$STATE" \
    -cp "$(classpath)" kafka.Kafka "$PROPS" \
    >"$LOG" 2>&1 </dev/null 9>&- &
  pid=$!
  echo "$pid" >"$PIDF"
  wait_ready "$pid"
  say "ready on $HOST:$PORT (pid $pid, Kafka $(cat "$LIBS/.complete"), $((SECONDS - t0))s)"
}

do_stop() {
  local pid deadline
  pid="$(broker_pid)"
  if [[ -z "$pid" ]]; then
    if port_open "$PORT"; then
      die "something answers on $HOST:$PORT but it is not the broker started from $PROPS"
    fi
    say "not running"
    rm -f "$PIDF"
    return 0
  fi
  # A stop is usually followed by a start from this checkout, which may not have its jars yet
  # (the broker may run from another checkout's): fetch them first, so that the broker is not
  # kept down for the download.
  fetch_jars
  say "stopping broker (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    say "still alive after ${STOP_TIMEOUT}s; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
  deadline=$((SECONDS + 30))
  while port_open "$PORT" || port_open "$CONTROLLER_PORT"; do
    (( SECONDS < deadline )) || die "ports $PORT/$CONTROLLER_PORT still open after stop"
    sleep 0.2
  done
  rm -f "$PIDF"
  say "stopped (data kept in $DATA)"
}

do_status() {
  local pid
  pid="$(broker_pid)"
  if port_open "$PORT"; then
    say "running on $HOST:$PORT${pid:+ (pid $pid)}"
    return 0
  fi
  say "not running${pid:+ (process $pid exists but port $PORT is closed)}"
  return 1
}

do_reset() {
  do_stop
  rm -rf "$DATA" "$CLUSTER_ID_FILE"
  say "data wiped"
}

cmd="${1:-start}"
mkdir -p "$CACHE" "$STATE"
case "$cmd" in
  status) do_status ;;
  start|stop|reset)
    # Serialize concurrent start/stop calls (e.g. parallel test setup).
    exec 9>"$LOCK"
    flock -w 300 9 || die "could not take $LOCK"
    "do_$cmd"
    ;;
  -h|--help|help) sed -n '2,17p' "$0" ;;
  *) die "unknown command '$cmd' (use start|stop|status|reset)" ;;
esac
