#!/usr/bin/env bash
# Runs the benchmarks whose figures docs/PERFORMANCE.md records, into bench-results/.
# Every ratio is against a reference measured in the same run. Takes about 15 minutes.
# Run it alone (kvf-bench scripts/bench.sh on the shared VM).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
scripts/build.sh -DKVFERRY_BUILD_BENCH=ON >/dev/null
out=bench-results
mkdir -p "$out"
export KVFERRY_LOG_LEVEL=warn
iperf_port=${KVFERRY_IPERF_PORT:-9160}

# iperf3 single stream on loopback, the external reference for tcp: one window of $2 seconds,
# its summary appended to $out/iperf3.txt, its JSON kept as $out/iperf3-$1.json and its
# GB/s and CPU-s/GB as $out/iperf3-$1-summary.json. $3, if given, is iperf3's write length
# (-l; its default is 128 KiB). iperf3 sends from one buffer of that length over and over and
# receives into one, so its bytes stay in cache: it measures the TCP stack on cache-resident
# bytes, and with -l 1M it is the strongest plain stream here.
iperf3_window() {
  iperf3 -s -1 -p "$iperf_port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$iperf_port" -t "$2" ${3:+-l "$3"} -J >"$out/iperf3-$1.json"
  wait "$server" || true
  python3 - "$out/iperf3-$1" "$1" <<'PY' | tee -a "$out/iperf3.txt"
import json, sys
end = json.load(open(sys.argv[1] + ".json"))["end"]
recv = end["sum_received"]
cpu = end["cpu_utilization_percent"]
gb = recv["bytes"] / 1e9
# host_total/remote_total: CPU time of each process over wall time, in percent.
cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100 * recv["seconds"]
summary = {"gbps": gb / recv["seconds"], "cpu_s_per_gb": cpu_s / gb}
json.dump(summary, open(sys.argv[1] + "-summary.json", "w"))
print(f"iperf3 single stream ({sys.argv[2]}): {summary['gbps']:.2f} GB/s  "
      f"cpu {summary['cpu_s_per_gb']:.2f} s/GB "
      f"(sender {cpu['host_total']:.0f}%, receiver {cpu['remote_total']:.0f}%)")
PY
}

echo "== iperf3: one TCP stream on loopback (the external reference for tcp)"
: >"$out/iperf3.txt"
iperf3_window start 5
iperf3_window start-1M 5 1M

# Two windows: 200 ms per contestant for the small blocks, 1 s for 64 KiB and up, whose
# cells of >= 1 MiB per batch run near memcpy (>= 0.9x); in 40 ms turns such a cell's ratio
# moved by 0.1-0.2 from run to run.
echo "== engine: local and shm vs memcpy"
build/kvferry bench engine --transports local,shm --threads 1,2 \
  --block-bytes 64,4096 --ops 1,16,128,1024 \
  --min-time-ms 200 --json "$out/engine-small.json" | tee "$out/engine.txt"
build/kvferry bench engine --transports local,shm --threads 1,2 \
  --block-bytes 65536,1048576,4194304,67108864 --ops 1,16,128,1024 \
  --min-time-ms 1000 --json "$out/engine-large.json" | tee -a "$out/engine.txt"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [r for part in ("small", "large") for r in json.load(open(f"{out}/engine-{part}.json"))]
json.dump(rows, open(f"{out}/engine.json", "w"), indent=1)
PY

echo "== engine: tcp vs the plain socket stream (ops=1: the plain round trip)"
build/kvferry bench engine --transports tcp --op write,read --threads 2 \
  --block-bytes 4096,65536,73728,1048576,4194304 --ops 1,16 \
  --min-time-ms 400 --json "$out/engine-tcp-1-16.json" | tee "$out/engine-tcp.txt"
# Batches of 128, one block size at a time, with iperf3 racing in the same turns (--iperf3:
# its default 128 KiB writes and -l 1M), so the ratio to iperf3 compares figures of one window.
tcp_blocks=(4096 65536 73728 1048576 4194304)
for block in "${tcp_blocks[@]}"; do
  build/kvferry bench engine --transports tcp --op write,read --threads 2 \
    --block-bytes "$block" --ops 128 --min-time-ms 1500 --rounds 6 \
    --iperf3 "$(command -v iperf3)" --iperf3-port "$iperf_port" \
    --json "$out/engine-tcp-128-$block.json" | tee -a "$out/engine-tcp.txt"
done
python3 - "$out" "${tcp_blocks[@]}" <<'PY' | tee "$out/engine-tcp-vs-iperf3.txt"
import json, sys
out, blocks = sys.argv[1], sys.argv[2:]
rows = json.load(open(f"{out}/engine-tcp-1-16.json"))
print("tcp, 128 ops per batch, against iperf3 in the same turns (default 128 KiB writes, "
      "and -l 1M):")
for b in blocks:
    cells = json.load(open(f"{out}/engine-tcp-128-{b}.json"))
    rows += cells
    for c in cells:
        iperf, big = c["iperf3_gbps"], c["iperf3_1m_gbps"]
        print(f"  {c['op']:5} block={int(b) // 1024:5d}KiB  {c['gbps']:6.2f} GB/s  "
              f"iperf3 {iperf:5.2f} GB/s ratio {c['gbps'] / iperf:4.2f}  "
              f"iperf3 -l 1M {big:5.2f} GB/s ratio {c['gbps'] / big:4.2f}  "
              f"(plain stream {c['ref_gbps']:5.2f}, ratio {c['ratio']:4.2f})  "
              f"cpu {c['cpu_s_per_gb']:4.2f} s/GB (iperf3 {c['iperf3_cpu_s_per_gb']:4.2f}, "
              f"-l 1M {c['iperf3_1m_cpu_s_per_gb']:4.2f})")
json.dump(rows, open(f"{out}/engine-tcp.json", "w"), indent=1)
PY

# Mooncake Transfer Engine, when its benchmark is at hand (MOONCAKE_BENCH=path of its
# transfer_engine_bench, built from Mooncake's source: docs/PERFORMANCE.md, "Mooncake"): one
# thread, single ops and batches of 128, tcp with the connection pool on, in the same turns as
# kvferry, the plain socket and iperf3.
if [ -n "${MOONCAKE_BENCH:-}" ]; then
  echo "== engine: tcp against Mooncake Transfer Engine's tcp in the same turns"
  build/kvferry bench engine --transports tcp --op write,read --threads 1 \
    --block-bytes 4096,65536,1048576 --ops 1,128 --min-time-ms 1500 \
    --iperf3 "$(command -v iperf3)" --iperf3-port "$iperf_port" --mooncake "$MOONCAKE_BENCH" \
    --json "$out/engine-tcp-mooncake.json" | tee "$out/engine-tcp-mooncake.txt"
fi

# Single small ops, one thread: the latency distribution (p50, p99, p99.9) against the plain
# round trip of the same run, quiet and with 1 and 2 busy processes beside the contestants.
echo "== engine: single small ops over tcp, quiet and under load"
: >"$out/engine-tcp-single.txt"
for load in 0 1 2; do
  build/kvferry bench engine --transports tcp --op write,read --threads 1 \
    --block-bytes 4096,65536 --ops 1 --min-time-ms 1000 --load "$load" \
    --json "$out/engine-tcp-single-load$load.json" | tee -a "$out/engine-tcp-single.txt"
done

# cma into a serve child's registered anonymous memory (what serving stacks register), with
# 4 KiB pages and then with huge pages advised on both sides; the second reference is the
# bare process_vm_writev of the same iovec lists (ratio/bare).
echo "== engine: cma vs memcpy and the bare system call (4 KiB pages, then huge pages)"
build/kvferry bench engine --transports cma --peer-memory host --threads 1,2 \
  --block-bytes 4096,1048576,4194304,67108864 --ops 1,16,1024 \
  --min-time-ms 500 --json "$out/engine-cma.json" | tee "$out/engine-cma.txt"
build/kvferry bench engine --transports cma --peer-memory host-thp --local-memory host-thp \
  --threads 1,2 --block-bytes 4096,1048576,4194304,67108864 --ops 1,16,1024 \
  --min-time-ms 500 --json "$out/engine-cma-thp.json" | tee "$out/engine-cma-thp.txt"
for memory in host host-thp; do
  build/kvferry bench kv --preset deepseek-v3 --pages random --tokens 4096 --transport cma \
    --cma-peer-memory "$memory" --threads 1,2 --strategy all_layers --min-time-ms 500 \
    --json "$out/kv-cma-$memory.json" | tee "$out/kv-cma-$memory.txt"
done

if grep -q '^KVFERRY_UCX:BOOL=ON' build/CMakeCache.txt; then
  # ucx over UCX's tcp transport (all these machines have; emulation allowed for the run),
  # against ucx_perftest on the same transport (put bandwidth; active-message bandwidth and
  # latency, which is what kvferry's ucx sends there) and kvferry's tcp, same run. The
  # active-message runs go twice: as ucx_perftest makes its endpoints by default (no error
  # handling), and with -e (peer-failure handling, as kvferry makes its own; UCX then moves
  # a rendezvous without zero copy over tcp, docs/TRANSPORTS.md "ucx").
  echo "== engine: ucx vs ucx_perftest (UCX_TLS=tcp) and vs kvferry tcp"
  port=${KVFERRY_UCX_PERFTEST_PORT:-13337}
  : > "$out/ucx-perftest.txt"
  for run in "ucp_put_bw 1048576 2000" "ucp_put_bw 4194304 2000" "ucp_am_bw 65536 20000" \
    "ucp_am_bw 1048576 2000" "ucp_am_lat 4096 20000" "ucp_am_bw 65536 20000 -e" \
    "ucp_am_bw 1048576 2000 -e" "ucp_am_lat 4096 20000 -e"; do
    read -r test size iterations flags <<< "$run"
    # shellcheck disable=SC2086 # $flags: none or one option
    UCX_TLS=tcp ucx_perftest -p "$port" $flags > /dev/null 2>&1 &
    server=$!
    sleep 1
    echo "$test size $size $flags" >> "$out/ucx-perftest.txt"
    # shellcheck disable=SC2086
    UCX_TLS=tcp ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$iterations" -w 100 \
      -f $flags | tee -a "$out/ucx-perftest.txt"
    wait "$server" || true
  done
  # One thread, as ucp_am_lat and ucp_am_bw run: single 4 KiB ops, and batches of 128.
  UCX_TLS=tcp KVFERRY_UCX_ALLOW_EMULATED=1 build/kvferry bench engine --transports ucx \
    --op write,read --threads 1 --block-bytes 4096 --ops 1 --min-time-ms 1000 \
    --json "$out/engine-ucx-single.json" | tee "$out/engine-ucx-single.txt"
  UCX_TLS=tcp KVFERRY_UCX_ALLOW_EMULATED=1 build/kvferry bench engine --transports ucx \
    --op write,read --threads 1 --block-bytes 65536,1048576 --ops 128 --min-time-ms 500 \
    --json "$out/engine-ucx-128.json" | tee "$out/engine-ucx-128.txt"
  UCX_TLS=tcp KVFERRY_UCX_ALLOW_EMULATED=1 build/kvferry bench engine --transports ucx,tcp \
    --threads 2 --block-bytes 1048576,4194304 --ops 1,16 --min-time-ms 500 \
    --json "$out/engine-ucx.json" | tee "$out/engine-ucx.txt"
  UCX_TLS=tcp KVFERRY_UCX_ALLOW_EMULATED=1 build/kvferry bench kv --preset deepseek-v3 \
    --pages random --tokens 4096 --transport tcp,ucx --threads 2 --min-time-ms 1000 \
    --json "$out/kv-ucx.json" | tee "$out/kv-ucx.txt"
fi

echo "== KV: deepseek-v3, random pages"
# --min-rounds: a 16k-token call takes ~100 ms, so 500 ms alone gave each strategy ~5 calls.
build/kvferry bench kv --preset deepseek-v3 --pages random --tokens 128,1024,4096,16384 \
  --transport local,shm --threads 1,2 --min-time-ms 500 --min-rounds 20 --json "$out/kv.json" |
  tee "$out/kv.txt"
build/kvferry bench kv --preset deepseek-v3 --pages random --tokens 4096 \
  --transport tcp --threads 2 --min-time-ms 1000 --json "$out/kv-tcp.json" | tee "$out/kv-tcp.txt"

# Opt-in integrity (PdIntegrity's digests on the critical path), interleaved with plain runs.
echo "== KV: integrity on and off"
build/kvferry bench kv --preset deepseek-v3,llama-3.1-8b --tokens 1024,16384 \
  --transport local,shm,tcp --threads 1 --strategy all_layers --integrity --min-time-ms 150 \
  --json "$out/kv-integrity.json" | tee "$out/kv-integrity.txt"

if [ -d build/python/kvferry ]; then
  echo "== Python: kvferry.plan and kvferry.nixl against the same work in C++"
  PYTHONPATH=build/python /usr/bin/python3 python/bench_plan.py --rounds 40 | tee "$out/python-plan.txt"
  PYTHONPATH=build/python /usr/bin/python3 python/bench_nixl.py --rounds 5 --pull | tee "$out/python-nixl.txt"
fi

# How costs grow with peers (256 `kvferry serve` children), regions, descriptors per batch,
# batches and PD requests in flight; scripts/plot.sh draws one chart per axis.
echo "== scale"
build/kvferry bench scale --peers 1,4,16,64,256 --json "$out/scale.json" | tee "$out/scale.txt"

echo "== planner micro-benchmarks"
build/kvferry_micro_bench --benchmark_min_time=0.3 | tee "$out/planner.txt"
