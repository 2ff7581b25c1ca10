#!/usr/bin/env bash
# The chaos scenario (tests/chaos/chaos_test.cc) for a chosen time, by hand: two prefill and
# two decode processes in network namespaces over tcp with etcd, impaired links, and faults
# (kill -9 + restart of each role, SIGSTOP/SIGCONT, etcd restarted with its data lost, a link
# dropped) at random moments under load, then its summary. Needs root. Builds first.
#   scripts/soak.sh [SECONDS] [SEED]     (default 600 s, a seed from the clock)
# Logs of a failed run are kept in /tmp/kvferry-chaos-SEED-PID.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
case "$seconds" in
  ''|*[!0-9]*) echo "soak.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac
if [ "$(id -u)" -ne 0 ]; then
  echo "soak.sh: needs root (network namespaces, nftables)" >&2
  exit 2
fi
scripts/setup.sh
TARGETS="kvferry_cli kvferry_chaos_test" scripts/build.sh
export KVFERRY_CHAOS_SECONDS="$seconds"
if [ -n "${2:-}" ]; then export KVFERRY_CHAOS_SEED="$2"; fi
export KVFERRY_LOG_LEVEL=${KVFERRY_LOG_LEVEL:-warn}
exec build/kvferry_chaos_test
