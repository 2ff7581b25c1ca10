#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs `kvferry demo` — a prefill
# process moving KV pages into a decode process on this machine, every page verified by
# the decode side, then a summary. Arguments go to `kvferry demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo needs: the build packages and the CLI, in the Release unity build that
# scripts/test.sh uses too (so it reuses these objects).
scripts/setup.sh build
UNITY=ON BUILD_TYPE=Release TARGETS=kvferry_cli scripts/build.sh -DKVFERRY_BUILD_TESTS=OFF \
  -DKVFERRY_BUILD_BENCH=OFF
exec build/kvferry demo "$@"
