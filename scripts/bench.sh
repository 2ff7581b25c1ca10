#!/usr/bin/env bash
# Runs the benchmarks whose figures docs/PERFORMANCE.md records, into bench-results/.
# Every ratio is against a reference measured in the same run. Takes a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
scripts/build.sh -DKVFERRY_BUILD_BENCH=ON >/dev/null
out=bench-results
mkdir -p "$out"
export KVFERRY_LOG_LEVEL=warn

echo "== engine: local and shm vs memcpy, tcp vs a plain TCP stream"
build/kvferry bench engine --transports local,shm --threads 1,2 \
  --block-bytes 64,4096,65536,1048576,4194304,67108864 --ops 1,128,1024 \
  --min-time-ms 300 --json "$out/engine.json" | tee "$out/engine.txt"
build/kvferry bench engine --transports tcp --threads 2 \
  --block-bytes 65536,1048576,4194304 --ops 1,16,128 \
  --min-time-ms 500 --json "$out/engine-tcp.json" | tee "$out/engine-tcp.txt"

if grep -q '^KVFERRY_UCX:BOOL=ON' build/CMakeCache.txt; then
  # ucx over UCX's tcp transport (all these machines have; emulation allowed for the run),
  # against ucx_perftest's put bandwidth on the same transport and kvferry's tcp, same run.
  echo "== engine: ucx vs ucx_perftest ucp_put_bw (UCX_TLS=tcp) and vs kvferry tcp"
  port=${KVFERRY_UCX_PERFTEST_PORT:-13337}
  : > "$out/ucx-perftest.txt"
  for size in 1048576 4194304; do
    UCX_TLS=tcp ucx_perftest -p "$port" > /dev/null 2>&1 &
    server=$!
    sleep 1
    echo "size $size" >> "$out/ucx-perftest.txt"
    UCX_TLS=tcp ucx_perftest 127.0.0.1 -p "$port" -t ucp_put_bw -s "$size" -n 2000 -w 100 -f \
      | tee -a "$out/ucx-perftest.txt"
    wait "$server" || true
  done
  UCX_TLS=tcp KVFERRY_UCX_ALLOW_EMULATED=1 build/kvferry bench engine --transports ucx,tcp \
    --threads 2 --block-bytes 1048576,4194304 --ops 1,16 --min-time-ms 500 \
    --json "$out/engine-ucx.json" | tee "$out/engine-ucx.txt"
fi

echo "== KV: deepseek-v3, random pages"
build/kvferry bench kv --preset deepseek-v3 --pages random --tokens 128,1024,4096,16384 \
  --transport local,shm --threads 1,2 --min-time-ms 500 --json "$out/kv.json" | tee "$out/kv.txt"
build/kvferry bench kv --preset deepseek-v3 --pages random --tokens 4096 \
  --transport tcp --threads 2 --min-time-ms 1000 --json "$out/kv-tcp.json" | tee "$out/kv-tcp.txt"

echo "== planner micro-benchmarks"
build/kvferry_micro_bench --benchmark_min_time=0.3 | tee "$out/planner.txt"
