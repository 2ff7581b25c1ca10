#!/usr/bin/env bash
# clang-tidy with the repo's .clang-tidy over the library sources (src/), using the compile
# commands of an existing build (BUILD_DIR, default build/). Any warning fails: fix it, or
# disable the check in .clang-tidy with the reason written beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/compile_commands.json" ]; then
  echo "tidy.sh: $BUILD_DIR/compile_commands.json is missing; run scripts/build.sh first" >&2
  exit 2
fi
# gcc-only warning flags in the compile commands are not clang's business here.
run-clang-tidy -p "$BUILD_DIR" -j "$JOBS" -quiet -extra-arg=-Wno-unknown-warning-option \
  "$PWD/src/.*\.cc$" > "$BUILD_DIR/clang-tidy.log" 2>&1 || status=$?
if grep -qE "(warning|error):" "$BUILD_DIR/clang-tidy.log"; then
  grep -E "(warning|error):" "$BUILD_DIR/clang-tidy.log" | sort -u >&2
  echo "tidy.sh: clang-tidy found the problems above (full log: $BUILD_DIR/clang-tidy.log)" >&2
  exit 1
fi
if [ "${status:-0}" -ne 0 ]; then
  tail -20 "$BUILD_DIR/clang-tidy.log" >&2
  exit "$status"
fi
echo "tidy.sh: clean ($(grep -c '"file"' "$BUILD_DIR/compile_commands.json") compile commands)"
