#!/usr/bin/env bash
# An installed Tutti, used the two ways its users use it: `cmake --install` into a temporary
# prefix, then a separate CMake project with find_package(Tutti) (tests/package/consumer), and the same
# program compiled and linked with nothing but `pkg-config --cflags --libs tutti`. Each runs a
# 3-rank allreduce on threads, checks the result exactly and that its headers are the library's.
# With TORCH_DIR (where libtorch's TorchConfig.cmake is; given when Tutti::torch was built), a
# third project uses find_package(Tutti COMPONENTS torch) and Tutti::torch (tests/package/consumer_torch).
#   install_test.sh BUILD_DIR SOURCE_DIR CXX VERSION [TORCH_DIR]
set -euo pipefail
build=$1 source=$2 cxx=$3 version=$4 torch_dir=${5:-}
work=$(mktemp -d /tmp/tutti-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/tutti/version.hpp" || { echo "install_test: no tutti/version.hpp installed"; exit 1; }

echo "== find_package(Tutti)"
# Quiet unless it fails: then its output says why.
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log"; echo "install_test: failed: $*"; exit 1; }; }
quiet cmake -S "$source/tests/package/consumer" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix"
quiet cmake --build "$work/cmake"
"$work/cmake/consumer"

echo "== pkg-config tutti"
pc=$(find "$prefix" -path '*/pkgconfig/tutti.pc' | head -n 1)
[[ -n $pc ]] || { echo "install_test: no pkgconfig/tutti.pc installed"; exit 1; }
export PKG_CONFIG_PATH=${pc%/tutti.pc}
found=$(pkg-config --modversion tutti)
[[ $found == "$version" ]] || { echo "install_test: tutti.pc says $found, the project $version"; exit 1; }
flags=$(pkg-config --cflags --libs tutti)
echo "pkg-config --cflags --libs tutti: $flags"
# shellcheck disable=SC2086 # the flags are words
"$cxx" -std=c++20 -o "$work/pkgconfig_consumer" "$source/tests/package/consumer/main.cpp" $flags
"$work/pkgconfig_consumer"

if [[ -n $torch_dir ]]; then
  echo "== find_package(Tutti COMPONENTS torch)"
  test ! -e "$prefix/include/tutti/torch_checkpoint_bytes.hpp" || { echo "install_test: a private header is installed"; exit 1; }
  quiet cmake -S "$source/tests/package/consumer_torch" -B "$work/torch" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    -DTorch_DIR="$torch_dir"
  quiet cmake --build "$work/torch"
  "$work/torch/torch_consumer"
else
  echo "== Tutti::torch not built: its consumer is not tested"
fi
