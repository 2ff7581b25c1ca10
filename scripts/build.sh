#!/usr/bin/env bash
# Configures and builds kvferry into build/ (Release with debug info, warnings as errors).
# Extra arguments go to cmake, e.g. scripts/build.sh -DKVFERRY_SANITIZE=ON. TARGETS (env)
# limits what ninja builds; BUILD_DIR, BUILD_TYPE (default RelWithDebInfo) and JOBS are
# honoured too. UNITY=ON makes it a unity build (CMake compiles sources in batches of 8 as
# one file): a cold build takes about half the time, and an edit recompiles its whole batch,
# so scripts/test.sh uses it and development does not (default OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} -DKVFERRY_WERROR=ON \
  -DCMAKE_UNITY_BUILD="${UNITY:-OFF}" -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 "$@" >/dev/null
# shellcheck disable=SC2086  # TARGETS is a list
ninja -C "$BUILD_DIR" -j "$JOBS" ${TARGETS:-}
