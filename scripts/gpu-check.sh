#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds kvferry with CUDA (build-gpu/), runs the cuda_ipc
# GPU tests and tcp's device-memory tests (device -> device across two processes over tcp on
# loopback, staged through pinned buffers, WRITE and READ; these must run, not skip), the
# deepseek-v3 all_layers / per_layer / single device copy benchmark, and the tcp benchmark
# device memory / host memory for WRITE and for READ (goal >= 0.7 each), and writes
# everything to a results file. About 3-5 minutes on one
# H200 (mostly the build); every step has a time limit so the whole stays under 8 minutes.
#   RESULTS  results file (default bench-results/gpu-check.txt)
#   JOBS     build parallelism (default: all cores)
# Exits non-zero, saying why, when there is no GPU, a GPU test fails or skips, or the
# benchmark misses its goals.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-$PWD/bench-results/gpu-check.txt}
mkdir -p "$(dirname "$RESULTS")"
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=build-gpu
export KVFERRY_LOG_LEVEL=${KVFERRY_LOG_LEVEL:-warn}

fail() { echo "gpu-check: FAILED: $*" | tee -a "$RESULTS" >&2; exit 1; }

: >"$RESULTS"
echo "== kvferry gpu-check $(date -u +%FT%TZ) on $(hostname)" | tee -a "$RESULTS"
command -v nvidia-smi >/dev/null || fail "no nvidia-smi: this script needs an NVIDIA GPU and driver"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$RESULTS" \
  || fail "nvidia-smi finds no GPU"
[ "$(nvidia-smi -L | grep -c '^GPU')" -ge 1 ] || fail "nvidia-smi lists no GPU"
cat "$RESULTS"

echo "== build (CUDA on, tests only)"
timeout 360 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVFERRY_CUDA=ON -DKVFERRY_WERROR=ON -DKVFERRY_BUILD_BENCH=OFF -DKVFERRY_PYTHON=OFF >/dev/null \
  || fail "cmake with -DKVFERRY_CUDA=ON (is the CUDA toolkit installed?)"
timeout 360 ninja -C "$BUILD_DIR" -j "$JOBS" kvferry_unit_tests || fail "build"
tests="$BUILD_DIR/kvferry_unit_tests"

echo "== cuda_ipc host-side and GPU tests" | tee -a "$RESULTS"
log=$(mktemp)
# The peer helper (CudaIpcPeer.Serve) and the no-device check skip by design; every other
# cuda_ipc test must run and pass.
set +e
timeout 180 "$tests" --gtest_filter='CudaIpc*:CacheFixture.*:ExportFixture.*:TransportChoice.*:DeviceOpValidation.*:SegmentDescriptorCuda.*:TcpDeviceGpu.*-CudaIpcBench.*' \
  >"$log" 2>&1
rc=$?
set -e
grep -E '^\[ +(OK|FAILED|SKIPPED) +\]' "$log" | tee -a "$RESULTS"
[ "$rc" -eq 0 ] || { tail -50 "$log"; fail "GPU tests (exit $rc)"; }
unexpected=$(grep -E '^\[  SKIPPED \] ' "$log" | grep -vE 'CudaIpcPeer\.Serve|CudaIpcNoDevice\.' | sort -u || true)
[ -z "$unexpected" ] || fail "GPU tests skipped on a GPU machine: $unexpected"
# tcp with device memory, both directions: WRITE (device -> device) and READ (the peer's
# device memory into ours and into host memory), each across two processes.
for t in TcpDeviceGpu.DeviceToDeviceAcrossTwoProcessesArrivesIntact \
  TcpDeviceGpu.DeviceReadAcrossTwoProcessesArrivesIntact; do
  grep -qE "^\[       OK \] $t " "$log" || fail "tcp device check $t did not pass"
done

echo "== benchmark: deepseek-v3, 4k and 16k tokens, random pages, page size 64" | tee -a "$RESULTS"
set +e
KVFERRY_CUDA_BENCH=1 KVFERRY_CUDA_BENCH_OUT="$RESULTS" timeout 180 "$tests" \
  --gtest_filter='CudaIpcBench.*' >"$log" 2>&1
rc=$?
set -e
grep -E '^deepseek|\[ +(OK|FAILED|SKIPPED) +\]' "$log" || true
[ "$rc" -eq 0 ] || { tail -40 "$log"; fail "benchmark (exit $rc; goals: all_layers <= 0.67x per_layer, >= 0.8x single-copy bandwidth)"; }
grep -q '^\[  SKIPPED \]' "$log" && fail "benchmark skipped on a GPU machine"

echo "== benchmark: tcp with device memory / tcp with host memory (256 MiB writes and reads, loopback)" | tee -a "$RESULTS"
set +e
KVFERRY_TCP_DEVICE_BENCH=1 KVFERRY_CUDA_BENCH_OUT="$RESULTS" timeout 180 "$tests" \
  --gtest_filter='TcpDeviceBench.*' >"$log" 2>&1
rc=$?
set -e
grep -E '^tcp_device|\[ +(OK|FAILED|SKIPPED) +\]' "$log" || true
[ "$rc" -eq 0 ] || { tail -40 "$log"; fail "tcp device benchmark (exit $rc)"; }
grep -q '^\[  SKIPPED \]' "$log" && fail "tcp device benchmark skipped on a GPU machine"
ratio=$(sed -n 's/^tcp_device .* ratio \([0-9.]*\) .*/\1/p' "$log" | tail -1)
[ -n "$ratio" ] || fail "tcp device benchmark printed no ratio"
awk -v r="$ratio" 'BEGIN { exit !(r >= 0.7) }' \
  || fail "tcp device/host ratio $ratio is below the goal 0.7"
read_ratio=$(sed -n 's/^tcp_device_read .* ratio \([0-9.]*\) .*/\1/p' "$log" | tail -1)
[ -n "$read_ratio" ] || fail "tcp device benchmark printed no READ ratio"
awk -v r="$read_ratio" 'BEGIN { exit !(r >= 0.7) }' \
  || fail "tcp device/host READ ratio $read_ratio is below the goal 0.7"
rm -f "$log"
echo "== gpu-check passed; results in $RESULTS" | tee -a "$RESULTS"
