#!/usr/bin/env bash
# The device check: one command on a machine with an NVIDIA GPU, over a prebuilt bundle
# (scripts/gpu_bundle.sh, built elsewhere), that ends within a global budget (default 450 s).
#   scripts/gpu_check.sh [BUNDLE]          (BUNDLE: default build-bundle)
# Stages, in this order, each under its own time cap (`timeout`); a stage that would not fit in
# what is left of the budget is skipped, saying so:
#   environment        driver, GPU, NCCL found, the bundle's manifest
#   cuda_waits         tools/cuda-waits: which CUDA calls wait for a stream held at a wait_value,
#                      then the latency of a flag seen by a parked stream and the enqueue costs
#   device_suite       device_gpu_test (the device layer on CUDA; a skipped case fails here)
#   process_gate       tests/gpu/gpu_gate_test.sh: ranks as processes on GPU 0, host_transfer and ipc
#                      at p = 2 and 4 (the gate)
#   nccl_p1            the same rank program with nccl: runs at p = 1, refused by name at p = 2
#   thread_diagnostics gpu_test and gpu_collectives_test with every rank a thread on GPU 0, on
#                      host_transfer and on automatic (a diagnostic, never a gate: its outcome is
#                      DIAG_PASS or DIAG_FAIL)
#   fault_cuda         tests/gpu/gpu_fault_test.sh quick: kill -9 a rank, survivors released with
#                      peer_failure naming it
#   engine_suite       engine_gpu_test
#   kernels            tutti-bench --kernels (f32 and bf16 sum beside a D2D copy, checked)
#   bench              tutti-bench --device cuda, allreduce, host_transfer, ipc and nccl at p = 1,
#                      host_transfer and ipc at p = 2 (checked; enqueue times and bus/d2d reported),
#                      then --overlap from 1 MiB to 64 MiB (nccl at p = 1, the others at p = 2)
# Each stage's outcome is appended to $OUT/gpu_check_results.tsv as it ends (stage, status,
# seconds, reason; status PASS, FAIL, TIMEOUT, SKIP, DIAG_PASS or DIAG_FAIL) and printed; its log
# goes to $OUT/gpu_check_logs/STAGE.log, cut to its first 64 KiB and last 192 KiB. OUT defaults to
# BUNDLE/out. Without a GPU (no nvidia-smi, it fails, or TUTTI_GPU_CHECK_DRY_RUN=1) every stage is
# SKIP and the exit status is 0 (ctest gpu_check_dry_run); else 0 when every stage but the
# diagnostics passed, 1 otherwise.
#   TUTTI_GPU_CHECK_BUDGET_S   the global budget in seconds (default 450)
#   TUTTI_GPU_CHECK_DEVICE     cuda (default), or emulated to rehearse the stages where there is no
#                              GPU (with an nvidia-smi that succeeds on the PATH): not a check
set -uo pipefail
self=$(readlink -f "$0")
root=$(cd "$(dirname "$self")/.." && pwd)

# ---- one stage's body, run by the driver below under `timeout` ----
if [[ ${1:-} == --stage ]]; then
  bundle=$TUTTI_GPU_CHECK_BUNDLE
  run=$bundle/tools/tutti-run
  bench=$bundle/tools/bench/tutti-bench
  export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  device=${TUTTI_GPU_CHECK_DEVICE:-cuda}  # emulated: a rehearsal of the machinery, not a check
  export TUTTI_TEST_GPU_DEVICE=$device
  # gtest BINARY [ARGS...]: a suite on CUDA; a skipped case fails (the GPU is there). Its output
  # goes to the log line by line, every case's RUN line included, so that a case that hangs is
  # named there even when the stage's cap ends it.
  gtest() {
    local out status
    out=$(mktemp)
    timeout -k 5 "${GTEST_CAP:-300}" stdbuf -oL -eL "$bundle/tests/$1" "${@:2}" 2>&1 | tee "$out"
    status=${PIPESTATUS[0]}
    if ((status == 0)) && [[ $device == cuda ]] && grep -q "SKIPPED" "$out"; then
      echo "FAIL: cases were skipped on a machine with a GPU"
      status=1
    fi
    rm -f "$out"
    return "$status"
  }
  # bench_run P BACKEND ARGS...: tutti-bench's device mode under tutti-run, every result checked.
  bench_run() {
    local p=$1 backend=$2 out status
    shift 2
    echo "== tutti-bench --device cuda --backend $backend at p = $p"
    out=$(timeout -k 5 60 "$run" -n "$p" --timeout-ms 45000 "$bench" --no-progress --device "$device" --backend "$backend" \
      --collective allreduce --peers sync -c 1 "$@" 2>&1)
    status=$?
    echo "$out"
    ((status == 0)) || { echo "FAIL: tutti-bench $backend at p = $p: exit status $status"; return 1; }
    grep -q "Out of bounds values : 0 OK" <<<"$out" || { echo "FAIL: tutti-bench $backend at p = $p: no clean footer"; return 1; }
  }
  case $2 in
    environment)
      nvidia-smi -L || exit 1
      nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || exit 1
      echo "== NCCL"
      ldconfig -p | grep -E "libnccl\.so" || echo "no libnccl in the linker cache (the nccl stage will say so)"
      echo "== bundle"
      cat "$bundle/MANIFEST" || exit 1
      for f in tests/device_gpu_test tests/gpu_gate_program tests/gpu_fault_program tests/gpu_test tests/gpu_collectives_test \
        tests/engine_gpu_test tools/tutti-run tools/cuda-waits tools/cuda-latency tools/bench/tutti-bench; do
        [[ -x $bundle/$f ]] || { echo "FAIL: the bundle has no $f"; exit 1; }
      done
      ;;
    cuda_waits)
      s=0
      "$bundle/tools/cuda-waits" || s=1
      "$bundle/tools/cuda-latency" || s=1
      exit $s
      ;;
    device_suite) GTEST_CAP=55 gtest device_gpu_test ;;
    process_gate)
      TUTTI_GPU_GATE_CASE_S=50 bash "$root/tests/gpu/gpu_gate_test.sh" "$run" "$bundle/tests/gpu_gate_program" \
        host_transfer:2 host_transfer:4 ipc:2 ipc:4
      ;;
    nccl_p1)
      TUTTI_GPU_GATE_CASE_S=40 bash "$root/tests/gpu/gpu_gate_test.sh" "$run" "$bundle/tests/gpu_gate_program" nccl:1 nccl:2
      ;;
    thread_diagnostics)
      # The whole suites, on host_transfer and on automatic (ipc where it serves the call).
      s=0
      for backend in host_transfer ""; do
        echo "== backend ${backend:-automatic}"
        TUTTI_TEST_GPU_BACKEND=$backend GTEST_CAP=40 gtest gpu_test || s=1
        TUTTI_TEST_GPU_BACKEND=$backend GTEST_CAP=40 gtest gpu_collectives_test || s=1
      done
      exit $s
      ;;
    fault_cuda) bash "$root/tests/gpu/gpu_fault_test.sh" "$run" "$bundle/tests/gpu_fault_program" quick ;;
    engine_suite) GTEST_CAP=55 gtest engine_gpu_test ;;
    kernels)
      out=$(timeout -k 5 50 "$run" -n 1 --timeout-ms 45000 "$bench" --no-progress --device "$device" --kernels -d f32,bf16 \
        -o sum -b 8 -e 256M -f 4 -c 1 2>&1)
      status=$?
      echo "$out"
      ((status == 0)) && grep -q "Out of bounds values : 0 OK" <<<"$out"
      ;;
    bench)
      s=0
      for backend in host_transfer ipc nccl; do bench_run 1 "$backend" -b 8 -e 128M -f 8 || s=1; done
      for backend in host_transfer ipc; do bench_run 2 "$backend" -b 8 -e 128M -f 8 || s=1; done
      # The overlap target: each allreduce beside a compute kernel of about its length on a second stream.
      bench_run 1 nccl -b 1M -e 64M -f 8 --overlap || s=1
      for backend in host_transfer ipc; do bench_run 2 "$backend" -b 1M -e 64M -f 8 --overlap || s=1; done
      exit $s
      ;;
    *)
      echo "gpu_check: unknown stage $2" >&2
      exit 2
      ;;
  esac
  exit
fi

# ---- the driver ----
bundle=$(readlink -f "${1:-$root/build-bundle}")
out=${OUT:-$bundle/out}
budget=${TUTTI_GPU_CHECK_BUDGET_S:-450}
mkdir -p "$out/gpu_check_logs" || exit 1
results=$out/gpu_check_results.tsv
printf "stage\tstatus\tseconds\treason\n" >"$results"
began=$SECONDS
deadline=$((SECONDS + budget))
failed=0

# The stages: name, cap (s), the least time worth starting it with (s), gate or diagnostic.
stages=(
  "environment 20 5 gate"
  "cuda_waits 60 40 gate"
  "device_suite 60 20 gate"
  "process_gate 210 60 gate"
  "nccl_p1 60 20 gate"
  "thread_diagnostics 120 30 diagnostic"
  "fault_cuda 100 40 gate"
  "engine_suite 60 20 gate"
  "kernels 55 20 gate"
  "bench 160 40 gate"
)

dry=""
if [[ ${TUTTI_GPU_CHECK_DRY_RUN:-0} == 1 ]]; then
  dry="dry run (TUTTI_GPU_CHECK_DRY_RUN=1)"
elif ! command -v nvidia-smi >/dev/null; then
  dry="no GPU here (nvidia-smi is not installed)"
elif ! gpus=$(timeout 15 nvidia-smi -L 2>&1) || [[ -z $gpus ]]; then
  dry="no GPU here (nvidia-smi -L: $(head -n 1 <<<"${gpus:-no output}"))"
fi

record() { # STAGE STATUS SECONDS REASON
  local reason=${4//$'\t'/ }
  reason=${reason//$'\n'/ }
  printf "%s\t%s\t%s\t%s\n" "$1" "$2" "$3" "${reason:0:300}" >>"$results"
  printf "gpu_check: %-18s %-9s %4s s  %s\n" "$1" "$2" "$3" "${reason:0:300}"
  [[ $2 == PASS || $2 == SKIP || $2 == DIAG_* ]] || failed=$((failed + 1))
}

# Keeps a log's first 64 KiB and last 192 KiB.
cap_log() {
  local log=$1 size
  size=$(stat -c %s "$log" 2>/dev/null || echo 0)
  ((size > 262144)) || return 0
  { head -c 65536 "$log"; printf "\n[... %d bytes cut ...]\n" $((size - 262144)); tail -c 196608 "$log"; } >"$log.cut"
  mv "$log.cut" "$log"
}

# Processes of the bundle a stage left behind (its timeout kills its process group; ranks in
# sessions of their own may outlive it): ended by id.
sweep() {
  local pids
  pids=$(pgrep -f -- "$bundle/" 2>/dev/null | grep -vx "$$") || return 0
  for pid in $pids; do kill -9 "$pid" 2>/dev/null; done
  echo "killed left-over processes:" $pids
}

run_stage() { # NAME CAP NEED KIND
  local name=$1 cap=$2 need=$3 kind=$4 left limit start status log reason verdict
  if [[ -n $dry ]]; then
    record "$name" SKIP 0 "$dry"
    return
  fi
  left=$((deadline - SECONDS))
  if ((left < need)); then
    record "$name" SKIP 0 "would not fit: ${left} s of the budget left, it needs ${need} s"
    return
  fi
  limit=$((cap < left ? cap : left))
  log=$out/gpu_check_logs/$name.log
  start=$SECONDS
  TUTTI_GPU_CHECK_BUNDLE=$bundle timeout -k 5 "$limit" bash "$self" --stage "$name" >"$log" 2>&1
  status=$?
  sweep >>"$log"
  cap_log "$log"
  if ((status == 0)); then
    verdict=PASS
    reason=$(grep -E "passed|PASSED|results checked" "$log" | tail -n 1)
  elif ((status == 124 || status == 137)); then
    verdict=TIMEOUT
    reason="ran past its cap of ${limit} s; last lines: $(tail -n 3 "$log" | tr '\n' ' ')"
  else
    verdict=FAIL
    reason=$(grep -m 3 -E "FAIL|Failure|error|Error" "$log" | tr '\n' ' ')
    [[ -n $reason ]] || reason="exit status $status; $(tail -n 2 "$log" | tr '\n' ' ')"
  fi
  [[ $kind == diagnostic ]] && verdict=DIAG_$verdict
  record "$name" "$verdict" $((SECONDS - start)) "$reason"
}

echo "gpu_check: bundle $bundle, results $results, budget ${budget} s${dry:+; $dry: every stage is skipped}"
for s in "${stages[@]}"; do
  # shellcheck disable=SC2086
  run_stage $s
  # Without the environment (no GPU after all, or no bundle) nothing else can run.
  if [[ ${s%% *} == environment ]] && [[ -z $dry ]] && [[ $(tail -n 1 "$results" | cut -f 2) != PASS ]]; then
    dry="the environment stage failed"
  fi
done
echo "gpu_check: $((SECONDS - began)) s, $failed stage(s) failed or timed out; results in $results"
[[ $failed -eq 0 ]]
