#!/usr/bin/env bash
# Ranks as threads of one process on one strict emulated context (TUTTI_EMULATED_STRICT=1: 8
# hardware queues shared round-robin, implicit waits; src/device/emulated_context.hpp): the cases
# that fail there the way the H100 failed (docs/gpu.md, "What ran where" and "The strict emulated
# device"). A diagnostic, never the gate: real jobs run ranks as processes (gpu_gate_strict).
# Usage: gpu_strict_diagnostic_test.sh GPU_TEST
#
# Each case states what it expects: REPRODUCES (the case fails, and its output has the failure's
# signature) or PASSES. A case that stops reproducing fails this test on purpose: a fix landed, so
# move the case back into the suites' strict runs (tests/gpu/CMakeLists.txt) and say so in docs/gpu.md.
# Every run is bounded (TUTTI_GPU_STRICT_CASE_S, 200 s; the collectives time out after 30 s).
set -u
gpu_test=$1
limit=${TUTTI_GPU_STRICT_CASE_S:-200}
source "$(dirname "$0")/../lib.sh"

# expect NAME EXPECTATION SIGNATURE ENV... -- FILTER
expect() {
  local name=$1 expectation=$2 signature=$3
  shift 3
  local envs=()
  while [[ $1 != -- ]]; do
    envs+=("$1")
    shift
  done
  local filter=$2 out="$scratch/$name.out" start=$SECONDS
  env TUTTI_EMULATED_STRICT=1 "${envs[@]}" timeout -s KILL "$limit" "$gpu_test" --gtest_filter="$filter" >"$out" 2>&1
  local status=$?
  local took=$((SECONDS - start))
  if [[ $expectation == REPRODUCES ]]; then
    local ok=1
    ((status != 0 && status != 137)) && grep -qE -- "$signature" "$out" && ok=0
    check "$name: reproduces ($took s, status $status)" $ok "$(tail -n 30 "$out")"
    ((ok == 0)) && grep -E -- "$signature" "$out" | head -n 3 | cut -c1-400 | sed 's/^/     /'
  else
    check "$name: passes ($took s)" "$status" "$(tail -n 30 "$out")"
  fi
}

# Fixed (gpu/local_order.hpp: ranks that share hardware queues submit collectives in order), and
# back in the suites' strict runs, also with one queue (gpu_test.strict.one_queue): an allreduce
# at p = 8 and two streams per rank at p = 4, which timed out here as on the H100 until then
# (docs/gpu.md).
#
# 1. Destroying a communicator behind a stream held by the caller's own flag: ~Ipc frees its
#    staging (allocate_shared: cudaFree), which waits for every stream of the context, the held
#    one included: on CUDA, a hang; here the strict mode names it (and the process ends on it,
#    the free being in a destructor).
expect destroy_behind_held_stream REPRODUCES "cudaFree \(memory from allocate_shared\) \(emulated, strict\) would hang" \
  TUTTI_TEST_GPU_BACKEND=host_transfer -- GpuHostTransfer.DestroyWithAHeldStreamDoesNotHang
# 2. Destroying a communicator with a host_transfer operation in flight while rank 1 never issues
#    it (the case expects ErrorCode::aborted from the destruction). With ranks that share hardware
#    queues the call itself now waits for rank 1 to issue the operation (local order) and records
#    `timeout` naming it after the operation's 2 s, before the destruction; without that, ~Impl's
#    destruction of ipc (cudaFree of its staging) waited behind host_transfer's held stream.
expect destroy_with_operation_in_flight REPRODUCES "did not issue it within 2000 ms|timed out after 2000 ms|would hang" \
  -- GpuHostTransfer.DestroyWithAnOperationInFlightRecordsAborted
finish "ranks as threads on one strict context (a diagnostic)"
