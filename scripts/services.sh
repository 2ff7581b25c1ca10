#!/usr/bin/env bash
# Starts or stops the servers the integration tests use — a real etcd and a real Redis on
# loopback ports — with their data in a throw-away directory.
#   scripts/services.sh start   prints the environment to export (KVFERRY_TEST_ETCD, ...)
#   scripts/services.sh stop
set -euo pipefail
STATE=${KVFERRY_SERVICES_DIR:-/tmp/kvferry-services}
ETCD_PORT=${KVFERRY_ETCD_PORT:-23790}
REDIS_PORT=${KVFERRY_REDIS_PORT:-63790}

wait_for() {  # name, command
  for _ in $(seq 1 100); do
    if eval "$2" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "services.sh: $1 did not come up; its log:" >&2
  cat "$STATE/$1.log" >&2 || true
  return 1
}

case "${1:-}" in
  start)
    "$0" stop >/dev/null 2>&1 || true
    mkdir -p "$STATE"
    etcd --name kvferry-test --data-dir "$STATE/etcd" \
      --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
      --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
      --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
      --initial-cluster "kvferry-test=http://127.0.0.1:$((ETCD_PORT + 10))" \
      >"$STATE/etcd.log" 2>&1 &
    echo $! >"$STATE/etcd.pid"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
      --dir "$STATE" >"$STATE/redis.log" 2>&1 &
    echo $! >"$STATE/redis.pid"
    wait_for etcd "curl -sf http://127.0.0.1:$ETCD_PORT/health"
    wait_for redis "redis-cli -p $REDIS_PORT ping"
    echo "export KVFERRY_TEST_ETCD=etcd://127.0.0.1:$ETCD_PORT"
    echo "export KVFERRY_TEST_REDIS=redis://127.0.0.1:$REDIS_PORT"
    ;;
  stop)
    for name in etcd redis; do
      if [ -f "$STATE/$name.pid" ]; then
        kill "$(cat "$STATE/$name.pid")" 2>/dev/null || true
        rm -f "$STATE/$name.pid"
      fi
    done
    sleep 0.2
    rm -rf "$STATE"
    ;;
  *)
    echo "usage: services.sh start|stop" >&2
    exit 2
    ;;
esac
