#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs `kvferry demo` — a prefill
# process moving KV pages into a decode process on this machine, every page verified by
# the decode side, then a summary. Arguments go to `kvferry demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/kvferry demo "$@"
