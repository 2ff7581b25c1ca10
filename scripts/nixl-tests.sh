#!/usr/bin/env bash
# NIXL's own Python tests and examples, unmodified, on kvferry's `nixl` shim, run as NIXL's CI
# runs them (its .gitlab/test_python.sh). NIXL's code stays outside this project: give a
# checkout of github.com/ai-dynamo/nixl.
#
#   scripts/nixl-tests.sh NIXL_CHECKOUT [BUILD_DIR]     (BUILD_DIR: build, with the Python module)
#
# Needs python3-torch, python3-pytest and python3-pytest-timeout (Debian's). What is left out,
# and why (docs/VLLM.md, "NIXL's own tests"):
#   * test/python/test_nixl_bindings.py: NIXL's raw C++ binding layer (nixlAgent.registerMem
#     and the like), which only NIXL has;
#   * the GPU tests (test_prep_mem_view): no GPU here, and UCX's GPU device API;
#   * examples/python/query_mem_example.py (POSIX and MOCK_DRAM storage plugins),
#     telemetry_reader.py (NIXL's shared-memory telemetry files).
# An etcd is started for the run (scripts/services.sh), NIXL_ETCD_ENDPOINTS naming it, as in
# NIXL's CI.
# Debian's torch is 1.13, which lacks torch.set_default_device (torch 2.0); the two-peer
# examples call it only to pick the CPU, so a stand-in for "cpu" is put on the path for them.
set -euo pipefail

nixl=${1:?usage: scripts/nixl-tests.sh NIXL_CHECKOUT [BUILD_DIR]}
nixl=$(cd "$nixl" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${2:-$root/build}" && pwd)
python=/usr/bin/python3
shim=$(PYTHONPATH="$build/python" "$python" -m kvferry.nixl --shim-path)
compat=$(mktemp -d)
cat >"$compat/sitecustomize.py" <<'EOF'
import torch

if not hasattr(torch, "set_default_device"):  # torch < 2.0
    def set_default_device(device):
        if str(device) != "cpu":
            raise RuntimeError(f"torch {torch.__version__}: only set_default_device('cpu') "
                               "is stood in for")

    torch.set_default_device = set_default_device
EOF
export PYTHONPATH="$shim:$build/python"
export KVFERRY_LOG_LEVEL=${KVFERRY_LOG_LEVEL:-error}
failed=()

trap '"$root/scripts/services.sh" stop >/dev/null 2>&1 || true; rm -rf "$compat"' EXIT
eval "$("$root/scripts/services.sh" start)"
export NIXL_ETCD_ENDPOINTS="http://${KVFERRY_TEST_ETCD#etcd://}"
export NIXL_ETCD_NAMESPACE=/nixl/python_ci

step() {  # step NAME COMMAND...: runs it, records a failure
  echo "==== $1"
  if ! "${@:2}"; then failed+=("$1"); fi
}

cd "$nixl"
step "pytest test/python (without the raw bindings)" \
  timeout 600 "$python" -m pytest -q -p no:cacheprovider test/python \
  --ignore=test/python/test_nixl_bindings.py
for mode in list array; do
  step "prep_xfer_perf.py $mode" timeout 300 "$python" test/python/prep_xfer_perf.py "$mode"
done

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cd examples/python
step "partial_md_example.py (socket exchange)" \
  timeout 120 "$python" partial_md_example.py \
  --init-port "$(free_port)" --target-port "$(free_port)"
step "partial_md_example.py --etcd" timeout 120 "$python" partial_md_example.py --etcd

run_two_peers() {  # the target on a port of its choosing, read from its log; then the initiator
  local script=$1 log port="" rc=0
  shift
  log=$(mktemp)
  PYTHONPATH="$compat:$PYTHONPATH" NIXL_LOG_LEVEL=INFO timeout 120 \
    "$python" "$script" --mode=target --ip=127.0.0.1 --port=0 2>"$log" &
  local target=$!
  for _ in $(seq 300); do
    port=$(awk '/MD listener is listening on port/ { print $NF; exit }' "$log")
    [[ -n "$port" ]] && break
    kill -0 "$target" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z "$port" ]]; then
    cat "$log"
    kill "$target" 2>/dev/null || true
    rm -f "$log"
    return 1
  fi
  env PYTHONPATH="$compat:$PYTHONPATH" "$@" timeout 120 \
    "$python" "$script" --mode=initiator --ip=127.0.0.1 --port="$port" || rc=$?
  wait "$target" || { rc=$?; echo "the target failed ($rc); its log:"; cat "$log"; }
  rm -f "$log"
  return "$rc"
}
step "basic_two_peers.py" run_two_peers basic_two_peers.py
step "expanded_two_peers.py (telemetry on)" run_two_peers expanded_two_peers.py \
  NIXL_TELEMETRY_ENABLE=y

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "NIXL's tests and examples passed on kvferry's nixl shim"
