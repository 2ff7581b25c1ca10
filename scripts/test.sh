#!/usr/bin/env bash
# The whole test suite: installs what is missing, checks formatting, builds everything in
# Release (gcc -O3, -Werror), runs clang-tidy over src/ (scripts/tidy.sh), runs every unit
# and integration test (and the chaos test) with etcd and Redis on loopback, installs that
# build and builds a consumer project against it, pip-installs the Python module into a
# fresh venv and runs pytest there, then builds the unit tests with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs them, then the unit tests under ThreadSanitizer, then
# runs the libFuzzer targets side by side for a bounded time (scripts/fuzz.sh, FUZZ_SECONDS).
# Every test stops by itself. CI builds Release once, and that one build is the one tested,
# installed and pip-packaged; scripts/build.sh's default for development stays RelWithDebInfo.
# Its three builds are unity builds (UNITY=ON): the phase table of a cold run, and why, is in
# docs/ARCHITECTURE.md ("CI time").
#   --no-sanitizers   skip the ASan+UBSan pass
#   --no-tsan         skip the ThreadSanitizer pass
#   --no-fuzz         skip the fuzzers
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=1
tsan=1
fuzz=1
for arg in "$@"; do
  case "$arg" in
    --no-sanitizers) sanitizers=0 ;;
    --no-tsan) tsan=0 ;;
    --no-fuzz) fuzz=0 ;;
    *) echo "test.sh: unknown argument '$arg' (valid: --no-sanitizers, --no-tsan, --no-fuzz)" >&2; exit 2 ;;
  esac
done
JOBS=${JOBS:-$(nproc)}
export KVFERRY_LOG_LEVEL=${KVFERRY_LOG_LEVEL:-warn}
start=$(date +%s)
# Each phase's wall time, printed as a table at the end (docs/ARCHITECTURE.md, "CI time").
phases=()
phase_name="setup"
phase_start=$start
phase() {
  local now
  now=$(date +%s)
  phases+=("$(printf '%-34s %5d s' "$phase_name" $((now - phase_start)))")
  phase_name=$1
  phase_start=$now
  echo "== $1"
}

scripts/setup.sh
phase "format check"
scripts/format.sh --check

phase "build (Release, gcc -O3, -Werror)"
# Every part on, also in a build/ that scripts/demo.sh configured for the CLI alone.
UNITY=ON BUILD_TYPE=Release scripts/build.sh -DKVFERRY_BUILD_TESTS=ON -DKVFERRY_BUILD_BENCH=ON \
  -DKVFERRY_PYTHON=ON -DKVFERRY_UCX=ON
phase "clang-tidy (src/)"
scripts/tidy.sh
phase "tests (etcd and redis on loopback)"
trap 'scripts/services.sh stop >/dev/null 2>&1 || true' EXIT
eval "$(scripts/services.sh start)"
ctest --test-dir build --output-on-failure -j "$JOBS" --timeout 600
scripts/services.sh stop
unset KVFERRY_TEST_ETCD KVFERRY_TEST_REDIS  # the tests after this find no service

phase "install, consumer project, pip"
# The installed tree and the venv come from the build just tested: the consumer project
# (tests/consumer) builds the README example against the installed CMake package and runs
# it; pip builds the module from the same CMake build and pytest runs against the venv.
pkg=$PWD/build/package
rm -rf "$pkg"
cmake --install build --prefix "$pkg/install" >/dev/null
cmake -S tests/consumer -B "$pkg/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$pkg/install" >/dev/null
ninja -C "$pkg/consumer"
"$pkg/consumer/engine_example"
/usr/bin/python3 -m venv --system-site-packages "$pkg/venv"
KVFERRY_CMAKE_BUILD_DIR=build KVFERRY_BUILD_JOBS="$JOBS" \
  "$pkg/venv/bin/pip" install -q --no-build-isolation --no-index .
(cd "$pkg/venv" && KVFERRY_PYTHON_PREFIX="$pkg/venv" \
  bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests")

if [ "$sanitizers" = 1 ]; then
  phase "unit tests under ASan+UBSan"
  # -O1 -g1, as for TSan below (ASan asks for -O1 or higher); reports still carry file:line.
  UNITY=ON BUILD_DIR=build-asan TARGETS=kvferry_unit_tests \
    scripts/build.sh -DKVFERRY_SANITIZE=ON -DKVFERRY_BUILD_BENCH=OFF -DKVFERRY_PYTHON=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j "$JOBS" --timeout 600
fi

if [ "$tsan" = 1 ]; then
  # Unit tests only: the integration tests run real child processes and gigabyte copies,
  # which TSan slows 5-15x (over the CI budget). halt_on_error: a report fails the run.
  # -O1 -g1: a cold build on 2 cores took 256 s against 352 s at -O2 -g, and the run 26 s
  # (TSan reports still carry file:line).
  phase "unit tests under ThreadSanitizer"
  UNITY=ON BUILD_DIR=build-tsan TARGETS=kvferry_unit_tests \
    scripts/build.sh -DKVFERRY_SANITIZE=thread -DKVFERRY_BUILD_BENCH=OFF -DKVFERRY_PYTHON=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  # UCX's libucm patches madvise, which glibc calls as a thread exits, after TSan tore down
  # that thread's state (a SIGSEGV in every test that ends a thread): keep its hooks off.
  UCX_MEM_MMAP_HOOK_MODE=none TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --test-dir build-tsan -L unit --output-on-failure -j "$JOBS" --timeout 600
fi

if [ "$fuzz" = 1 ]; then
  phase "fuzzers (libFuzzer + ASan + UBSan)"
  JOBS="$JOBS" scripts/fuzz.sh
fi
phase "wall time per phase"
printf '%s\n' "${phases[@]}"
echo "== all tests passed in $(( $(date +%s) - start )) s"
