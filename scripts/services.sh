#!/usr/bin/env bash
# Start or stop the local etcd and Redis the integration tests use.
#
#   scripts/services.sh start   install Debian's etcd-server / redis-server if missing, start both on
#                               127.0.0.1 (etcd 23790 client / 23800 peer, redis 63790) with data under
#                               .ci-state/, wait until they answer, write their pids there
#   scripts/services.sh stop    stop both and remove their data
#
# Ports can be moved with ETCD_PORT, ETCD_PEER_PORT and REDIS_PORT; the tests read
# REACH_TEST_ETCD / REACH_TEST_REDIS (host:port). No systemd: the binaries run directly.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=.ci-state
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
REDIS_PORT=${REDIS_PORT:-63790}
WAIT_SECONDS=${WAIT_SECONDS:-30}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

install_missing() {
  local packages=()
  command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
  command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
  if ((${#packages[@]})); then
    echo "services: installing ${packages[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  fi
}

running() {
  [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_until() {
  local what=$1
  shift
  for _ in $(seq $((WAIT_SECONDS * 10))); do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  echo "services: $what did not answer within ${WAIT_SECONDS}s; see $STATE/*.log" >&2
  return 1
}

etcd_answers() {
  local reply
  exec 3<>"/dev/tcp/127.0.0.1/$ETCD_PORT" || return 1
  printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  reply=$(cat <&3)
  exec 3<&-
  [[ $reply == *'"health":"true"'* ]]
}

redis_answers() {
  [[ $(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping) == PONG ]]
}

start() {
  install_missing
  mkdir -p "$STATE"
  if running "$STATE/etcd.pid"; then
    echo "services: etcd already running (pid $(cat "$STATE/etcd.pid"))"
  else
    rm -rf "$STATE/etcd"
    etcd --name reach-test --data-dir "$STATE/etcd" \
      --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
      --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
      --initial-cluster "reach-test=http://127.0.0.1:$ETCD_PEER_PORT" \
      >"$STATE/etcd.log" 2>&1 &
    echo $! >"$STATE/etcd.pid"
  fi
  if running "$STATE/redis.pid"; then
    echo "services: redis already running (pid $(cat "$STATE/redis.pid"))"
  else
    mkdir -p "$STATE/redis"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$PWD/$STATE/redis" \
      --save "" --appendonly yes --appendfsync everysec --daemonize no \
      >"$STATE/redis.log" 2>&1 &
    echo $! >"$STATE/redis.pid"
  fi
  wait_until "etcd on 127.0.0.1:$ETCD_PORT" etcd_answers
  wait_until "redis on 127.0.0.1:$REDIS_PORT" redis_answers
  echo "services: etcd 127.0.0.1:$ETCD_PORT, redis 127.0.0.1:$REDIS_PORT"
}

stop_one() {
  local pidfile=$STATE/$1.pid
  if running "$pidfile"; then
    local pid
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$pidfile"
  rm -rf "${STATE:?}/$1"
}

stop() {
  stop_one etcd
  stop_one redis
  echo "services: stopped"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
