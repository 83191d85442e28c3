#!/usr/bin/env bash
# Builds and gathers what scripts/gpu_check.sh runs on a GPU machine that cannot build Tutti (no
# Debian packages, no network): the CUDA build's test and tool binaries (stripped), the shared
# libraries they load that such a machine may lack, and a MANIFEST (commit, date, architectures).
#   scripts/gpu_bundle.sh [BUILD [OUT]]     (default: build-gpu-bundle and build-bundle)
# BUILD is configured when it has no CMakeCache.txt: RelWithDebInfo, warnings as errors, kernels
# for sm_90 only (TUTTI_CUDA_ARCHITECTURES=90: the H100/H200 the device machines have), no MPI
# and no Python (neither is needed there, and MPI would drag its libraries in). Only the targets
# below are built. Refuses a bundle over 60 MiB. Then, on the GPU machine:
#   scripts/gpu_check.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu-bundle}
out=${2:-build-bundle}
targets=(device_gpu_test gpu_test gpu_collectives_test engine_gpu_test gpu_gate_program gpu_fault_program tutti-run tutti-bench
  cuda-waits cuda-latency)
files=(tests/device_gpu_test tests/gpu_test tests/gpu_collectives_test tests/engine_gpu_test tests/gpu_gate_program
  tests/gpu_fault_program tools/tutti-run tools/bench/tutti-bench tools/cuda-waits tools/cuda-latency)
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTUTTI_WERROR=ON -DTUTTI_CUDA_ARCHITECTURES=90 \
    -DTUTTI_PYTHON=OFF -DTUTTI_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
fi
grep -q "^TUTTI_WITH_CUDA:INTERNAL=ON" "$build/CMakeCache.txt" || { echo "gpu_bundle: $build is not a CUDA build" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
rm -rf "$out"
mkdir -p "$out/tests" "$out/tools/bench" "$out/lib"
for f in "${files[@]}"; do strip -o "$out/$f" "$build/$f"; done
# Every shared library the binaries load beyond the C and C++ runtimes (libcrypto, Gloo and what it
# needs; CUDA's runtime is linked statically, NCCL is opened at run time).
for f in "${files[@]}"; do ldd "$out/$f"; done |
  awk '$3 ~ /^\// && !/libc\.so|libm\.so|libstdc|libgcc_s|ld-linux|libpthread|libdl\.so|librt\.so/ {print $3}' | sort -u |
  xargs -r cp -L -t "$out/lib"
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- src include tests tools || echo ' (with local changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "cuda architectures $(grep '^TUTTI_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" | cut -d= -f2)"
  echo "nvcc $(grep 'CMAKE_CUDA_COMPILER_VERSION ' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -n 1 | grep -oE '[0-9][0-9.]+' || echo unknown)"
  echo "build type $(grep '^CMAKE_BUILD_TYPE:' "$build/CMakeCache.txt" | cut -d= -f2)"
} >"$out/MANIFEST"
cat "$out/MANIFEST"
kib=$(du -sk "$out" | cut -f 1)
echo "gpu_bundle: $out is $((kib / 1024)) MiB"
((kib <= 60 * 1024)) || { echo "gpu_bundle: over 60 MiB" >&2; exit 1; }
