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
#
# A second etcd runs secured, as production should (DESIGN.md 11.4): TLS with client certificates
# (--client-cert-auth) and authentication on, on ETCD_TLS_PORT (default ETCD_PORT+1; peer ETCD_TLS_PEER_PORT).
# Its CA and certificates are made at start under .ci-state/etcd-secure/tls (one per user: the certificate's
# CN is the etcd user) and the role layout is applied (see secure_layout). The security tests read
# REACH_TEST_ETCD_TLS (host:port) and REACH_TEST_ETCD_TLS_DIR; the plain etcd stays for every other test.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=.ci-state
ETCD_PORT=${ETCD_PORT:-23790}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-23800}
REDIS_PORT=${REDIS_PORT:-63790}
WAIT_SECONDS=${WAIT_SECONDS:-30}
ETCD_TLS_PORT=${ETCD_TLS_PORT:-$((ETCD_PORT + 1))}
ETCD_TLS_PEER_PORT=${ETCD_TLS_PEER_PORT:-$((ETCD_PEER_PORT + 1))}
SECURE=$STATE/etcd-secure
TLS=$SECURE/tls
SECURE_AGENTS=(echo rogue)

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

install_missing() {
  local packages=()
  command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || packages+=(etcd-client)
  command -v openssl >/dev/null 2>&1 || packages+=(openssl)
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

make_cert() { # make_cert NAME CN [server]: a P-256 key and a certificate signed by the test CA
  local name=$1 cn=$2 ext
  ext="extendedKeyUsage=clientAuth"
  [[ ${3:-} == server ]] && ext="subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth,clientAuth"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
    -keyout "$TLS/$name-key.pem" -out "$TLS/$name.csr" 2>/dev/null
  openssl x509 -req -in "$TLS/$name.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca-key.pem" -CAcreateserial -days 2 \
    -extfile <(printf '%s\n' "$ext") -out "$TLS/$name.pem" 2>/dev/null
  rm -f "$TLS/$name.csr"
}

make_pki() {
  mkdir -p "$TLS"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=reach-test-ca" \
    -keyout "$TLS/ca-key.pem" -out "$TLS/ca.pem" 2>/dev/null
  make_cert server 127.0.0.1 server
  make_cert root root
  make_cert reach-operator reach-operator
  make_cert reach-client reach-client # not an etcd user: password users present it for the TLS handshake
  for agent in "${SECURE_AGENTS[@]}"; do make_cert "reach-agent-$agent" "reach-agent-$agent"; done
  openssl rand -hex 16 >"$TLS/reach-gateway.password"
  chmod 600 "$TLS"/*-key.pem "$TLS"/*.password
}

secure_ctl() {
  ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$ETCD_TLS_PORT" --cacert="$TLS/ca.pem" \
    --cert="$TLS/root.pem" --key="$TLS/root-key.pem" "$@" >/dev/null
}

# The role layout (README "Security model"): operators write everything under /reach/ (descriptors with
# `reach agents --load`); an agent's user reads /reach/ and writes only /reach/instances/<its name>/;
# gateways and nodes only read. Users authenticate by certificate CN, or by password (reach-gateway here).
secure_layout() {
  secure_ctl user add root --no-password
  secure_ctl user grant-role root root
  secure_ctl role add reach-reader
  secure_ctl role grant-permission reach-reader --prefix=true read /reach/
  secure_ctl role add reach-operator
  secure_ctl role grant-permission reach-operator --prefix=true readwrite /reach/
  secure_ctl user add reach-operator --no-password
  secure_ctl user grant-role reach-operator reach-operator
  secure_ctl user add reach-gateway --new-user-password="$(cat "$TLS/reach-gateway.password")"
  secure_ctl user grant-role reach-gateway reach-reader
  for agent in "${SECURE_AGENTS[@]}"; do
    secure_ctl role add "reach-agent-$agent"
    secure_ctl role grant-permission "reach-agent-$agent" --prefix=true readwrite "/reach/instances/$agent/"
    secure_ctl user add "reach-agent-$agent" --no-password
    secure_ctl user grant-role "reach-agent-$agent" reach-reader
    secure_ctl user grant-role "reach-agent-$agent" "reach-agent-$agent"
  done
  secure_ctl auth enable
}

secure_answers() {
  ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$ETCD_TLS_PORT" --cacert="$TLS/ca.pem" \
    --cert="$TLS/root.pem" --key="$TLS/root-key.pem" --dial-timeout=1s endpoint health
}

start_secure() {
  if running "$STATE/etcd-secure.pid"; then
    echo "services: secured etcd already running (pid $(cat "$STATE/etcd-secure.pid"))"
    return
  fi
  rm -rf "$SECURE"
  mkdir -p "$SECURE"
  make_pki
  etcd --name reach-secure --data-dir "$SECURE/data" \
    --listen-client-urls "https://127.0.0.1:$ETCD_TLS_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_TLS_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
    --initial-cluster "reach-secure=http://127.0.0.1:$ETCD_TLS_PEER_PORT" \
    --cert-file "$TLS/server.pem" --key-file "$TLS/server-key.pem" \
    --client-cert-auth --trusted-ca-file "$TLS/ca.pem" --auth-token-ttl 86400 \
    >"$STATE/etcd-secure.log" 2>&1 &
  echo $! >"$STATE/etcd-secure.pid"
  wait_until "secured etcd on 127.0.0.1:$ETCD_TLS_PORT" secure_answers
  secure_layout
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
  start_secure
  echo "services: etcd 127.0.0.1:$ETCD_PORT, redis 127.0.0.1:$REDIS_PORT," \
    "secured etcd 127.0.0.1:$ETCD_TLS_PORT (TLS + auth, certificates in $TLS)"
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
  stop_one etcd-secure
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
