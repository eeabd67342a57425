#!/usr/bin/env bash
# Bring up a RabbitMQ broker (Debian's rabbitmq-server) on 127.0.0.1:5672,
# user guest/guest (allowed from localhost), node rabbit@localhost.
#
#   tests/brokers/rabbitmq.sh [start|stop|status|reset]
#
# start  (default) install rabbitmq-server with apt-get if missing, start it
#        detached, wait until it is fully booted. Exits 0 at once if it already
#        answers.
# stop   rabbitmqctl stop, wait until the node and port 5672 are gone. Data
#        (durable queues, persistent messages) is kept for the next start.
# status exit 0 and print "running" if the node answers, else exit 1.
# reset  stop and wipe the node's data (queues, exchanges, messages).
#
# Needs root (apt-get, and the rabbitmq CLI wrappers switch to the rabbitmq
# user). Env override: RABBITMQ_START_TIMEOUT (default 120 s).
set -euo pipefail

DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="$DIR/.cache"
LOCK="$CACHE/rabbitmq.lock"
HOST=127.0.0.1
PORT=5672
NODE=rabbit@localhost
ENV_CONF=/etc/rabbitmq/rabbitmq-env.conf
LOGDIR=/var/log/rabbitmq
MNESIA=/var/lib/rabbitmq/mnesia
START_TIMEOUT="${RABBITMQ_START_TIMEOUT:-120}"
STOP_TIMEOUT=60

say() { echo "[rabbitmq] $*"; }
die() { echo "[rabbitmq] ERROR: $*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# The CLI tools are Erlang programs that take ~1 s to start; bound each call.
ctl() { timeout 60 rabbitmqctl -n "$NODE" "$@"; }
node_pings() { timeout 30 rabbitmq-diagnostics -n "$NODE" -q ping >/dev/null 2>&1; }
# beam process of our node (the Erlang VM runs as the rabbitmq user): from the
# node's pid file if that is a live rabbit VM, else any rabbit VM of that user.
node_pid() {
  local pid
  if [[ -s "$MNESIA/$NODE.pid" ]]; then
    pid="$(tr -dc '0-9' <"$MNESIA/$NODE.pid")"
    if [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'beam.*-s rabbit boot'; then
      echo "$pid"; return 0
    fi
  fi
  pgrep -u rabbitmq -f 'beam.*-s rabbit boot' 2>/dev/null | head -n1 || true
}

log_tail() {
  local f
  for f in "$LOGDIR/$NODE.log" "$LOGDIR/startup_log" "$LOGDIR/startup_err" "$CACHE/rabbitmq-start.log"; do
    if [[ -s "$f" ]]; then
      echo "----- last 40 lines of $f -----" >&2
      tail -n 40 "$f" >&2 || true
    fi
  done
  echo "---------------------------------" >&2
}

install_rabbitmq() {
  if command -v rabbitmq-server >/dev/null 2>&1 && command -v rabbitmqctl >/dev/null 2>&1; then
    return 0
  fi
  [[ "$(id -u)" = 0 ]] || die "rabbitmq-server is missing and installing it needs root"
  say "installing rabbitmq-server with apt-get (one-time)..."
  # Keep the package's postinst from starting the service through
  # invoke-rc.d/systemd (there is no init system here): policy-rc.d 101.
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  local rc=0
  {
    apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
      rabbitmq-server
  } >"$CACHE/rabbitmq-install.log" 2>&1 </dev/null || rc=$?
  if (( made_policy )); then rm -f /usr/sbin/policy-rc.d; fi
  if (( rc != 0 )); then
    tail -n 30 "$CACHE/rabbitmq-install.log" >&2
    die "apt-get install rabbitmq-server failed (rc $rc)"
  fi
  say "installed $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo '?')"
}

# Node name rabbit@localhost (does not depend on the machine's hostname
# resolving) and AMQP on 127.0.0.1:5672 only. rabbitmqctl reads the same file,
# so plain `rabbitmqctl list_queues` targets this node too.
configure() {
  mkdir -p /etc/rabbitmq
  touch "$ENV_CONF"
  local kv key
  for kv in "NODENAME=$NODE" "NODE_IP_ADDRESS=$HOST" "NODE_PORT=$PORT"; do
    key="${kv%%=*}"
    if grep -q "^$key=" "$ENV_CONF"; then
      grep -qx "$kv" "$ENV_CONF" || sed -i "s|^$key=.*|$kv|" "$ENV_CONF"
    else
      echo "$kv" >>"$ENV_CONF"
    fi
  done
}

wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT))
  until node_pings; do
    (( SECONDS < deadline )) || { log_tail; die "node $NODE did not answer within ${START_TIMEOUT}s"; }
    if [[ -z "$(node_pid)" ]] && (( SECONDS > ${1:-0} + 15 )); then
      log_tail; die "node $NODE is not running (it exited during startup?)"
    fi
    sleep 1
  done
  local left=$((deadline - SECONDS)); (( left > 5 )) || left=5
  ctl await_startup --timeout "$left" >/dev/null 2>&1 \
    || { log_tail; die "node $NODE did not finish booting within ${START_TIMEOUT}s"; }
  until port_open "$PORT"; do
    (( SECONDS < deadline )) || { log_tail; die "node up but $HOST:$PORT closed"; }
    sleep 0.5
  done
}

do_start() {
  local t0=$SECONDS
  if port_open "$PORT" && command -v rabbitmqctl >/dev/null 2>&1 && node_pings; then
    say "already running on $HOST:$PORT (node $NODE)"
    return 0
  fi
  install_rabbitmq
  configure
  if [[ -n "$(node_pid)" ]]; then
    say "node $NODE is starting already; waiting for it"
  else
    say "starting rabbitmq-server -detached (node $NODE, logs in $LOGDIR)"
    # Runs as the rabbitmq user via Debian's wrapper; -detached daemonizes.
    rabbitmq-server -detached >"$CACHE/rabbitmq-start.log" 2>&1 </dev/null 9>&- \
      || { log_tail; die "rabbitmq-server -detached failed"; }
  fi
  wait_ready "$t0"
  say "ready on $HOST:$PORT (node $NODE, guest/guest, $((SECONDS - t0))s)"
}

do_stop() {
  local pid deadline
  pid="$(node_pid)"
  if [[ -z "$pid" ]] && ! port_open "$PORT"; then
    say "not running"
    return 0
  fi
  say "stopping node $NODE${pid:+ (pid $pid)}"
  if command -v rabbitmqctl >/dev/null 2>&1; then
    ctl stop >/dev/null 2>&1 || true
  fi
  deadline=$((SECONDS + STOP_TIMEOUT))
  while { [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; } || port_open "$PORT"; do
    if (( SECONDS >= deadline )); then
      if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        say "still alive after ${STOP_TIMEOUT}s; sending KILL to $pid"
        kill -KILL "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 10))
        pid=""
        continue
      fi
      die "$HOST:$PORT still open after stop"
    fi
    sleep 0.5
  done
  say "stopped (data kept in $MNESIA)"
}

do_status() {
  if port_open "$PORT" && node_pings; then
    say "running on $HOST:$PORT (node $NODE)"
    return 0
  fi
  say "not running"
  return 1
}

do_reset() {
  do_stop
  rm -rf "${MNESIA:?}/$NODE" "${MNESIA:?}/$NODE"-* "${MNESIA:?}/$NODE".pid
  say "data wiped"
}

cmd="${1:-start}"
mkdir -p "$CACHE"
case "$cmd" in
  status) do_status ;;
  start|stop|reset)
    # Serialize concurrent start/stop calls.
    exec 9>"$LOCK"
    flock -w 300 9 || die "could not take $LOCK"
    "do_$cmd"
    ;;
  -h|--help|help) sed -n '2,17p' "$0" ;;
  *) die "unknown command '$cmd' (use start|stop|status|reset)" ;;
esac
