#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cc: the tcp wire header, the segment descriptor
# and the PD control message decoders) with clang, ASan and UBSan into build-fuzz, and runs
# them side by side for one bounded wall time, each from its seed corpus in
# fuzz/corpus/<target>/ (new inputs go to build-fuzz/corpus/, never into the source tree).
# Side by side, the targets share the cores: the run costs FUZZ_SECONDS of wall time
# whatever the number of targets, and each target gets cores × FUZZ_SECONDS ÷ targets of CPU.
# Fails on any crash, sanitizer report, leak, timeout or broken round trip; the reproducer is
# left in build-fuzz/artifacts/ and can be replayed with `build-fuzz/<target>_fuzz FILE`.
#   FUZZ_SECONDS=N   wall time of the whole run (default 90)
#   BUILD_DIR=DIR    build directory (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-90}
build=${BUILD_DIR:-build-fuzz}
jobs=${JOBS:-$(nproc)}
targets=(tcp_wire segment_descriptor control_message)
# Per-target libFuzzer flags: the tcp receiver reads one 48-byte header, and for a vector
# frame a table of up to 1,024 16-byte entries after it.
declare -A target_flags=(
  [tcp_wire]="-max_len=16432"
  [segment_descriptor]="-dict=fuzz/segment_descriptor.dict"
  [control_message]=""
)
# A single input that takes longer than this is a hang, reported as a failure.
per_input_timeout_s=10

echo "== fuzz: building ${targets[*]} with clang into $build"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DKVFERRY_FUZZ=ON -DKVFERRY_WERROR=ON \
  -DKVFERRY_BUILD_TESTS=OFF -DKVFERRY_BUILD_BENCH=OFF >/dev/null
ninja -C "$build" -j "$jobs" kvferry_fuzzers

mkdir -p "$build/artifacts"
echo "== fuzz: ${targets[*]} side by side for ${seconds} s"
declare -A pids=()
for target in "${targets[@]}"; do
  corpus="$build/corpus/$target"
  mkdir -p "$corpus"
  # shellcheck disable=SC2086  # the flags are words
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/${target}_fuzz" -max_total_time="$seconds" -timeout="$per_input_timeout_s" \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$target-" ${target_flags[$target]} \
    "$corpus" "fuzz/corpus/$target" >"$build/$target.log" 2>&1 &
  pids[$target]=$!
done
failed=()
for target in "${targets[@]}"; do
  log="$build/$target.log"
  if wait "${pids[$target]}"; then
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    echo "   $target ok: $execs execs ($rate/s); $(echo "$done_line" | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*')"
  else
    failed+=("$target")
    echo "   FAILED: $target (log: $log; reproducer: $build/artifacts/$target-*)" >&2
    tail -40 "$log" >&2
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: ${failed[*]} failed" >&2
  exit 1
fi
echo "== fuzz: all ${#targets[@]} targets ran clean"
