#!/usr/bin/env bash
# Installs the Debian 12 packages kvferry needs. `scripts/setup.sh build` installs only what
# building the library and the CLI needs (scripts/demo.sh); with no argument, also what the
# tests, sanitizers, benches and the Python module need.
# Idempotent: packages already present are skipped, and apt-get update runs only when
# something is missing. Safe to re-run.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
  libcpp-httplib-dev libhiredis-dev libssl-dev prometheus-cpp-dev libucx-dev
)
if [ "${1:-all}" != build ]; then
  packages+=(
    libgtest-dev libgmock-dev libbenchmark-dev
    etcd-server etcd-client redis-server nftables iproute2 curl
    clang-format clang-tidy clang libclang-rt-14-dev
    pybind11-dev python3-dev python3-numpy python3-pytest
    iperf3 ucx-utils
    python3-venv python3-pip python3-setuptools python3-wheel
    prometheus gnuplot-nox jq stress-ng
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
