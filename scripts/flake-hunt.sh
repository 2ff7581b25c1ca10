#!/usr/bin/env bash
# Hunts flaky tests: runs the integration and Python tests ROUNDS times (default 5) while
# stress-ng keeps every core busy, and prints each test that failed at least once with the
# rounds it failed in. The failing tests' output is kept under the printed log directory.
# Run it before submitting a change that touches a test or a timing path (CI does not).
#   scripts/flake-hunt.sh [ROUNDS]        LABELS (env, ctest -L regex) = 'integration|python'
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
LABELS=${LABELS:-integration|python}
JOBS=${JOBS:-$(nproc)}
export KVFERRY_LOG_LEVEL=${KVFERRY_LOG_LEVEL:-warn}
scripts/setup.sh >/dev/null
UNITY=ON BUILD_TYPE=Release scripts/build.sh -DKVFERRY_BUILD_TESTS=ON -DKVFERRY_PYTHON=ON
logs=$(mktemp -d /tmp/kvferry-flake-hunt-XXXXXX)
load=""
cleanup() {
  if [ -n "$load" ]; then kill "$load" 2>/dev/null || true; fi
  scripts/services.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
eval "$(scripts/services.sh start)"
declare -A failed_in=()
for round in $(seq 1 "$ROUNDS"); do
  # One load worker per core for at most an hour: it cannot outlive a stuck round.
  stress-ng --cpu "$(nproc)" --timeout 3600 --quiet &
  load=$!
  start=$(date +%s)
  ctest --test-dir build -L "$LABELS" -j "$JOBS" --timeout 600 --output-on-failure \
    >"$logs/round-$round.log" 2>&1 || true
  kill "$load" 2>/dev/null || true
  wait "$load" 2>/dev/null || true
  load=""
  failures=$(sed -n '/The following tests FAILED:/,$p' "$logs/round-$round.log" |
    sed -nE 's/^[[:space:]]+[0-9]+ - (.*) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)\)$/\1/p')
  echo "round $round/$ROUNDS: $(($(date +%s) - start)) s, $(echo -n "$failures" | grep -c . || true) failed"
  while IFS= read -r t; do
    [ -n "$t" ] && failed_in["$t"]+=" $round"
  done <<<"$failures"
done
if [ ${#failed_in[@]} -eq 0 ]; then
  echo "flake-hunt: no test failed in $ROUNDS rounds under load (logs: $logs)"
  exit 0
fi
echo "flake-hunt: tests that failed at least once (logs: $logs):"
for t in "${!failed_in[@]}"; do echo "  $t: rounds${failed_in[$t]}"; done
exit 1
