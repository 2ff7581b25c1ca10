#!/usr/bin/env bash
# clang-tidy with the repo's .clang-tidy over the library sources (src/). It reads the compile
# commands of a configure-only tree of its own (TIDY_DIR, default build-tidy; cmake takes a few
# seconds and builds nothing): one command per source file, whatever the builds do (CI's are
# unity builds, whose commands name the combined sources). Any warning fails: fix it, or
# disable the check in .clang-tidy with the reason written beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
TIDY_DIR=${TIDY_DIR:-build-tidy}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$TIDY_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFERRY_BUILD_TESTS=OFF \
  -DKVFERRY_BUILD_BENCH=OFF -DKVFERRY_PYTHON=OFF -DCMAKE_UNITY_BUILD=OFF >/dev/null
# gcc-only warning flags in the compile commands are not clang's business here.
run-clang-tidy -p "$TIDY_DIR" -j "$JOBS" -quiet -extra-arg=-Wno-unknown-warning-option \
  "$PWD/src/.*\.cc$" > "$TIDY_DIR/clang-tidy.log" 2>&1 || status=$?
if grep -qE "(warning|error):" "$TIDY_DIR/clang-tidy.log"; then
  grep -E "(warning|error):" "$TIDY_DIR/clang-tidy.log" | sort -u >&2
  echo "tidy.sh: clang-tidy found the problems above (full log: $TIDY_DIR/clang-tidy.log)" >&2
  exit 1
fi
if [ "${status:-0}" -ne 0 ]; then
  tail -20 "$TIDY_DIR/clang-tidy.log" >&2
  exit "$status"
fi
echo "tidy.sh: clean ($(grep -c '"file"' "$TIDY_DIR/compile_commands.json") compile commands)"
