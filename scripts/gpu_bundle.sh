#!/usr/bin/env bash
# Gathers what scripts/gpu_check.sh needs on a GPU machine that cannot build Tutti (no Debian
# packages, no network): the CUDA build's test and tool binaries (stripped) and the shared libraries
# they load that such a machine may lack (libcrypto), in the layout gpu_check.sh expects.
#   scripts/gpu_bundle.sh BUILD OUT    (BUILD: a build with TUTTI_WITH_CUDA, the targets below built)
# then, on the GPU machine: LD_LIBRARY_PATH=OUT/lib TUTTI_GPU_CHECK_PREBUILT=1 TUTTI_GPU_CHECK_BUILD=OUT scripts/gpu_check.sh
set -euo pipefail
build=${1:?usage: gpu_bundle.sh BUILD OUT}
out=${2:?usage: gpu_bundle.sh BUILD OUT}
grep -q "^TUTTI_WITH_CUDA:INTERNAL=ON" "$build/CMakeCache.txt" || { echo "gpu_bundle: $build is not a CUDA build" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/tests" "$out/tools/bench" "$out/lib"
for f in tests/device_gpu_test tests/gpu_test tests/gpu_collectives_test tests/engine_gpu_test tools/tutti-run tools/bench/tutti-bench tools/cuda-waits; do
  strip -o "$out/$f" "$build/$f"
done
# Every shared library the binaries load beyond the C and C++ runtimes (libcrypto, Gloo and what it
# needs; CUDA's runtime is linked statically, NCCL is opened at run time).
for f in "$out"/tests/* "$out"/tools/tutti-run "$out"/tools/bench/tutti-bench; do ldd "$f"; done |
  awk '$3 ~ /^\// && !/libc\.so|libm\.so|libstdc|libgcc_s|ld-linux|libpthread|libdl\.so|librt\.so/ {print $3}' | sort -u |
  xargs -r cp -L -t "$out/lib"
du -sh "$out"
