#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: builds Tutti with CUDA (as scripts/build.sh does,
# into its own build directory) and runs every GPU check, then tutti-bench's device mode:
#   1. nvidia-smi -L (which GPUs this is), and tools/cuda-waits (which CUDA calls wait for a stream
#      held at a wait_value; run with and without CUDA_DEVICE_MAX_CONNECTIONS=32);
#   2. the build (RelWithDebInfo, warnings as errors, CUDA when CMake finds the toolkit);
#   3. ctest -L gpu (the suites on the CUDA device; a skipped case counts as a failure here, since
#      the GPU is there) and ctest -L emulated (the same protocols on the emulated device);
#   4. tutti-bench --device cuda --peers sync for every backend at p = 1, 2, 4 (under tutti-run),
#      every collective gpu::Communicator has, checked; a backend tutti-bench refuses as not built
#      yet is listed as skipped;
#   5. tutti-bench --device cuda --kernels on one rank: the reduction kernels (f32 sum, bf16 sum)
#      beside a device-to-device copy, checked.
# The suites run ranks as threads with their own rank counts (gpu_test and device_test name their
# device; the CUDA build of the device suite is device_gpu_test, label gpu), so only tutti-bench
# takes a process count.
# Without a GPU (no nvidia-smi, or it fails) it says so and runs the emulated-device versions
# instead (ctest -L emulated, tutti-bench --device emulated, --kernels included, and --device cuda's
# one-line refusal), so that the script itself is exercised. Ends with "gpu_check: N passed, M
# failed"; the exit status is 1 if anything failed (no GPU alone is not a failure).
#
#   scripts/gpu_check.sh            (build directory: build-gpu, or TUTTI_GPU_CHECK_BUILD)
#   TUTTI_GPU_CHECK_BENCH="-b 8 -e 1G -f 2" scripts/gpu_check.sh    (tutti-bench's sizes)
#   TUTTI_GPU_CHECK_KERNELS="-b 1M -e 1G -f 4" scripts/gpu_check.sh  (--kernels' sizes)
#   TUTTI_GPU_CHECK_PREBUILT=1 TUTTI_GPU_CHECK_BUILD=DIR scripts/gpu_check.sh
#       (a machine that cannot build Tutti: the binaries scripts/gpu_bundle.sh gathered into DIR;
#       no build, no ctest: the suites run as the binaries themselves)
# With a GPU, the stream-aware collective suites (gpu_test, gpu_collectives_test) also run on the
# CUDA device (TUTTI_TEST_GPU_DEVICE=cuda: every rank a thread on GPU 0, backend host_transfer,
# since ipc and nccl refuse two ranks on one GPU; and automatic, which must then pick it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${TUTTI_GPU_CHECK_BUILD:-build-gpu}
passed=0
failed=0
skipped=()

pass() { echo "gpu_check: ok   $1"; passed=$((passed + 1)); }
flunk() { echo "gpu_check: FAIL $1"; failed=$((failed + 1)); }
finish() {
  for s in "${skipped[@]}"; do echo "gpu_check: skipped $s"; done
  echo "gpu_check: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit
}

echo "== nvidia-smi -L"
gpu=0
if ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi is not installed): running the emulated-device versions only"
elif ! gpus=$(nvidia-smi -L 2>&1) || [[ -z $gpus ]]; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L: ${gpus:-no output}): running the emulated-device versions only"
else
  echo "$gpus"
  gpu=1
fi

prebuilt=${TUTTI_GPU_CHECK_PREBUILT:-0}
if ((prebuilt)); then
  echo "== prebuilt binaries in $build"
  for f in tests/device_gpu_test tests/gpu_test tests/gpu_collectives_test tools/tutti-run tools/bench/tutti-bench; do
    [[ -x $build/$f ]] || { flunk "prebuilt: $build/$f is missing"; finish; }
  done
  pass "prebuilt binaries present"
else
echo "== build ($build)"
bash scripts/deps.sh || echo "gpu_check: scripts/deps.sh failed; building with what is installed"
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTUTTI_WERROR=ON -DTUTTI_CUDA=ON >/dev/null; then
  flunk "cmake configure"
  finish
fi
targets=()
((gpu)) || targets=(--target tutti-run tutti-bench device_test gpu_test)  # all of it with a GPU: every gpu suite
if ! cmake --build "$build" -j "$(nproc)" "${targets[@]}"; then
  flunk "build"
  finish
fi
if grep -q "^TUTTI_WITH_CUDA:INTERNAL=ON" "$build/CMakeCache.txt"; then
  pass "built with CUDA"
elif ((gpu)); then
  flunk "built without CUDA (CMake found no CUDA toolkit: is nvcc on the PATH?)"
else
  echo "gpu_check: built without CUDA (no toolkit found)"
fi
fi
logs="$build/gpu_check"
mkdir -p "$logs"

# suite LABEL: one ctest label; with a GPU, a skipped case means the CUDA device did not open.
suite() {
  local label=$1 log="$logs/ctest-$1.log"
  echo "== ctest -L $label"
  if ! ctest --test-dir "$build" -L "$label" --no-tests=error --output-on-failure --timeout 600 -j "$(nproc)" |
    tee "$log"; then
    flunk "ctest -L $label ($(grep -E 'tests passed|tests failed' "$log" | tail -n 1))"
  elif ((gpu)) && grep -q "\*\*\*Skipped\|SKIPPED" "$log"; then
    flunk "ctest -L $label: cases were skipped on a machine with a GPU (see $log)"
  else
    pass "ctest -L $label ($(grep -E 'tests passed' "$log" | tail -n 1))"
  fi
}

# binary NAME ENV... -- BINARY: one gtest binary run directly, with the environment given; with a
# GPU, a skipped case is a failure (the CUDA device did not open).
binary() {
  local name=$1 log="$logs/$1.log"
  shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  echo "== $name"
  if ! timeout -s KILL 600 env "${envs[@]}" "$build/tests/$1" --gtest_brief=1 >"$log" 2>&1; then
    tail -n 40 "$log"
    flunk "$name ($(grep -E 'PASSED|FAILED' "$log" | head -n 2 | tr '\n' ' '))"
  elif grep -q "SKIPPED" "$log"; then
    tail -n 20 "$log"
    flunk "$name: cases were skipped on a machine with a GPU"
  else
    pass "$name ($(grep -E '^\[  PASSED  \]' "$log"))"
  fi
}

# The suites on the CUDA device: the device layer, and the collective suites with every rank on GPU 0.
cuda_suites() {
  binary device_gpu_test -- device_gpu_test
  for backend in host_transfer automatic; do
    for suite in gpu_test gpu_collectives_test; do
      binary "$suite-cuda-$backend" TUTTI_TEST_GPU_DEVICE=cuda TUTTI_TEST_GPU_BACKEND=${backend/automatic/} -- "$suite"
    done
  done
}

run=$build/tools/tutti-run
bench=$build/tools/bench/tutti-bench
# bench DEVICE BACKEND P: tutti-bench's device mode on P ranks, every collective, checked.
bench_run() {
  local device=$1 backend=$2 p=$3 name="tutti-bench --device $1 --backend $2 at p=$3"
  local out="$logs/bench-$device-$backend-p$p" sizes
  if [[ $device == cuda ]]; then
    sizes=${TUTTI_GPU_CHECK_BENCH:--b 8 -e 64M -f 4}
  else
    sizes=${TUTTI_GPU_CHECK_BENCH:--b 8 -e 1M -f 8 -n 5 -w 2}
  fi
  echo "== $name"
  # ipc has no alltoall: the collectives it has.
  local collectives=all
  [[ $backend == ipc ]] && collectives=allreduce,reduce_scatter,allgather,broadcast,reduce
  # shellcheck disable=SC2086
  timeout -s KILL 600 "$run" -n "$p" --timeout-ms 120000 "$bench" --no-progress --device "$device" --backend "$backend" \
    -t $collectives $sizes --peers sync -c 1 --json "$out.json" >"$out.log" 2>"$out.err"
  local status=$?
  cat "$out.log"
  # A backend this machine cannot run (nccl without a CUDA device, or with two ranks on one GPU).
  if [[ $status -ne 0 ]] && grep -q "has no $backend backend yet\|the $backend backend is not available" "$out.err" "$out.log"; then
    skipped+=("$name: $(sed -E 's/^\[[0-9]+\] //' "$out.err" | head -n 1)")
  else
    judge "$name" "$status" "$out"
  fi
}

# judge NAME STATUS OUT: a tutti-bench run passes when it exited 0 with a clean footer.
judge() {
  local name=$1 status=$2 out=$3
  if [[ $status -ne 0 ]]; then
    sed 's/^/    | /' "$out.err" | tail -n 20
    flunk "$name (exit status $status)"
  elif ! grep -q "Out of bounds values : 0 OK" "$out.log"; then
    flunk "$name (no clean footer)"
  else
    pass "$name"
  fi
}

# kernels_run DEVICE: tutti-bench --kernels on one rank, the device's reduction kernel beside a
# D2D copy for f32 sum and bf16 sum, every row checked bit for bit against the host's kernel.
kernels_run() {
  local device=$1 name="tutti-bench --device $1 --kernels" out="$logs/kernels-$1" sizes
  if [[ $device == cuda ]]; then
    sizes=${TUTTI_GPU_CHECK_KERNELS:--b 8 -e 256M -f 4}
  else
    sizes=${TUTTI_GPU_CHECK_KERNELS:--b 8 -e 1M -f 8 -n 5 -w 2}
  fi
  echo "== $name"
  # shellcheck disable=SC2086
  timeout -s KILL 600 "$run" -n 1 --timeout-ms 120000 "$bench" --no-progress --device "$device" --kernels \
    -d f32,bf16 -o sum $sizes -c 1 --json "$out.json" >"$out.log" 2>"$out.err"
  local status=$?
  cat "$out.log"
  judge "$name" "$status" "$out"
}

# cuda-waits: which CUDA calls wait for a held stream, with the default hardware queues and with
# the 32 Tutti asks for (a report, read by a person; it fails only if CUDA does).
waits_run() {
  local exe=$build/tools/cuda-waits
  [[ -x $exe ]] || { skipped+=("cuda-waits: not built"); return; }
  for connections in "" 32; do
    echo "== cuda-waits (CUDA_DEVICE_MAX_CONNECTIONS=${connections:-unset})"
    if timeout -s KILL 120 env ${connections:+CUDA_DEVICE_MAX_CONNECTIONS=$connections} "$exe" | tee "$logs/cuda-waits${connections}.log"; then
      pass "cuda-waits (CUDA_DEVICE_MAX_CONNECTIONS=${connections:-unset})"
    else
      flunk "cuda-waits (CUDA_DEVICE_MAX_CONNECTIONS=${connections:-unset})"
    fi
  done
}

if ((gpu)); then
  waits_run
  cuda_suites
  ((prebuilt)) || suite emulated
  for p in 1 2 4; do
    for backend in host_transfer ipc nccl automatic; do bench_run cuda "$backend" "$p"; done
  done
  kernels_run cuda
else
  suite emulated
  for p in 1 2 4; do
    for backend in host_transfer ipc nccl automatic; do bench_run emulated "$backend" "$p"; done
  done
  kernels_run emulated
  echo "== tutti-bench --device cuda without a GPU"
  timeout -s KILL 60 "$run" -n 2 "$bench" --no-progress --device cuda >"$logs/cuda-refused.log" 2>&1
  status=$?
  if [[ $status -eq 1 ]] && [[ $(grep -c "tutti-bench: --device cuda: " "$logs/cuda-refused.log") -eq 1 ]]; then
    pass "tutti-bench --device cuda refuses in one line: $(grep "tutti-bench: " "$logs/cuda-refused.log")"
  else
    cat "$logs/cuda-refused.log"
    flunk "tutti-bench --device cuda without a GPU (exit status $status)"
  fi
fi
finish
