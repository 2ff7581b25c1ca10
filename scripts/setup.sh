#!/usr/bin/env bash
# Installs the Debian 12 packages kvferry needs to build, test and benchmark.
# Idempotent: packages already present are skipped, and apt-get update runs only when
# something is missing. Safe to re-run.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libxxhash-dev
  libcpp-httplib-dev libzmq3-dev cppzmq-dev libhiredis-dev libssl-dev
  etcd-server etcd-client redis-server nftables iproute2 curl
  clang-format clang-tidy clang libclang-rt-14-dev
  pybind11-dev python3-dev python3-numpy python3-pytest
  iperf3
  libucx-dev ucx-utils
  python3-venv python3-pip python3-setuptools python3-wheel
  prometheus-cpp-dev prometheus gnuplot-nox jq
)

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
