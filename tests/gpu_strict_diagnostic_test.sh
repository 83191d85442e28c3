#!/usr/bin/env bash
# Ranks as threads of one process on one strict emulated context (TUTTI_EMULATED_STRICT=1: 8
# hardware queues shared round-robin, implicit waits; src/device/emulated_context.hpp): the cases
# that fail there the way the H100 failed (docs/gpu.md, "What ran where" and "The strict emulated
# device"). A diagnostic, never the gate: real jobs run ranks as processes (gpu_gate_strict).
# Usage: gpu_strict_diagnostic_test.sh GPU_TEST
#
# Each case states what it expects: REPRODUCES (the case fails, and its output has the failure's
# signature) or PASSES. A case that stops reproducing fails this test on purpose: a fix landed, so
# move the case back into the suites' strict runs (tests/CMakeLists.txt) and say so in docs/gpu.md.
# Every run is bounded (TUTTI_GPU_STRICT_CASE_S, 200 s; the collectives time out after 30 s).
set -u
gpu_test=$1
limit=${TUTTI_GPU_STRICT_CASE_S:-200}
source "$(dirname "$0")/lib.sh"

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

# 1. Every rank a thread at p = 8, host_transfer: two ranks' streams share a hardware queue, the
#    first one's wait for its host collective holds the other's copy-in, whose rank then never
#    arrives: the collective times out (the H100: "still fails at p = 8, a 1-element call, two
#    ranks never arrive"). p = 1 to 4 pass.
expect allreduce_p8_threads REPRODUCES "p = 8|timed out after 30000 ms; still waiting for rank" \
  TUTTI_TEST_GPU_BACKEND=host_transfer -- GpuHostTransfer.AllreduceCountsAndSizes
# 2. Two streams per rank at p = 4 (8 streams of the test beside the devices' pool streams): the
#    same (the H100: BackToBackOnOneAndTwoStreams at p = 4); the released streams copy back
#    unreduced staging, read as a wrong result where the case does not check() first.
expect two_streams_p4_threads REPRODUCES "p = 4" \
  TUTTI_TEST_GPU_BACKEND=host_transfer -- GpuHostTransfer.BackToBackOnOneAndTwoStreams
# 3. The same two with 32 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=32, what the CUDA device
#    asks for): no two streams share a queue, and both pass.
expect thirty_two_queues PASSES "" CUDA_DEVICE_MAX_CONNECTIONS=32 TUTTI_TEST_GPU_BACKEND=host_transfer -- \
  "GpuHostTransfer.AllreduceCountsAndSizes:GpuHostTransfer.BackToBackOnOneAndTwoStreams"
# 4. Destroying a communicator behind a stream held by the caller's own flag: ~Ipc frees its
#    staging (allocate_shared: cudaFree), which waits for every stream of the context, the held
#    one included: on CUDA, a hang; here the strict mode names it (and the process ends on it,
#    the free being in a destructor).
expect destroy_behind_held_stream REPRODUCES "cudaFree \(memory from allocate_shared\) \(emulated, strict\) would hang" \
  TUTTI_TEST_GPU_BACKEND=host_transfer -- GpuHostTransfer.DestroyWithAHeldStreamDoesNotHang
# 5. Destroying a communicator with a host_transfer operation in flight: ~Impl destroys ipc first,
#    whose cudaFree of its staging waits behind host_transfer's held stream: either the
#    operation's own 2 s timeout releases it (the record then says timeout, not aborted) or the
#    strict mode's 2 s hold limit names the cudaFree first.
expect destroy_with_operation_in_flight REPRODUCES "timed out after 2000 ms|would hang" \
  -- GpuHostTransfer.DestroyWithAnOperationInFlightRecordsAborted
finish "ranks as threads on one strict context (a diagnostic)"
