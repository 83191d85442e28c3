#!/usr/bin/env bash
# Installs the Debian packages Tutti builds and tests with (only those missing). clang and
# libclang-rt-dev build the fuzz targets (libFuzzer); ccache speeds up the sanitizer builds.
set -euo pipefail
packages=(cmake ninja-build g++ make libgtest-dev libgmock-dev libbenchmark-dev clang-format libopenmpi-dev openmpi-bin procps nlohmann-json3-dev libcli11-dev libdlpack-dev pkgconf libgloo-dev python3-matplotlib libtorch-dev dataset-fashion-mnist python3-torch zlib1g-dev libssl-dev clang libclang-rt-dev ccache pybind11-dev python3-dev python3-torchvision python3-filelock python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "tutti: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
