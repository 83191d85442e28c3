#!/usr/bin/env bash
# The GPU process gate: ranks as processes under tutti-run sharing one device (what real jobs run:
# one process per GPU; on a machine with one GPU, every rank on GPU 0).
# Usage: gpu_gate_test.sh TUTTI_RUN GPU_GATE_PROGRAM [BACKEND:P ...]
# Cases default to host_transfer and ipc at p = 2 and 4, and nccl at p = 1 and 2. The device is
# TUTTI_TEST_GPU_DEVICE (cuda or emulated; emulated when unset), passed on to the ranks.
# tests/gpu/gpu_gate_program.cpp says what every rank runs and checks. A case passes when tutti-run exits
# 0, every rank printed PASS (nccl on the emulated device, or at p >= 2 on one GPU: REFUSED,
# unsupported, naming why), and nothing of the job is left (processes, /dev/shm segments, files
# under its TMPDIR). Each case is bounded by `timeout` (TUTTI_GPU_GATE_CASE_S, 150 s); ranks time
# out their own collectives after 30 s and synchronise at most 120 s.
set -u
run=$1 program=$2
shift 2
cases=("$@")
((${#cases[@]})) || cases=(host_transfer:2 host_transfer:4 ipc:2 ipc:4 nccl:1 nccl:2)
limit=${TUTTI_GPU_GATE_CASE_S:-150}
device=${TUTTI_TEST_GPU_DEVICE:-emulated}
source "$(dirname "$0")/../lib.sh"
work=$scratch

for c in "${cases[@]}"; do
  backend=${c%%:*} n=${c##*:}
  name="$backend p=$n ($device)"
  dir=$(mktemp -d "$work/run.XXXXXX")
  mkdir "$dir/tmp"
  start=$SECONDS
  env TMPDIR="$dir/tmp" TUTTI_TEST_GPU_DEVICE="$device" timeout -s KILL "$limit" "$run" -n "$n" --timeout-ms 60000 \
    --grace-period 5 "$program" "$backend" >"$dir/out" 2>&1
  status=$?
  text=$(cat "$dir/out")
  expect=PASS
  [[ $backend == nccl ]] && { [[ $device != cuda ]] || ((n >= 2)); } && expect=REFUSED
  check "$name: tutti-run exits 0 within ${limit} s ($((SECONDS - start)) s)" "$([[ $status -eq 0 ]] && echo 0 || echo 1)" \
    "status $status; output:
$(tail -n 60 <<<"$text")"
  ok=0
  for ((r = 0; r < n; r++)); do
    grep -qE "^(\[[0-9]+\] )?rank $r: $expect " <<<"$text" || ok=1
  done
  [[ $expect == REFUSED ]] && ! grep -qE "rank [0-9]+: REFUSED unsupported: .*nccl backend is not available" <<<"$text" && ok=1
  grep -q "FAIL" <<<"$text" && ok=1
  check "$name: every rank $expect" $ok "$(grep -E "rank [0-9]+: (PASS|FAIL|REFUSED)" <<<"$text" | head -n 20)"
  grep -E "rank [0-9]+: (PASS|REFUSED|FAIL)" <<<"$text" | sed 's/^/     /'
  # Nothing of the job left behind.
  left=""
  job=$(grep -oE "rank 0: job [^ ]+" <<<"$text" | head -n 1 | awk '{print $4}')
  if [[ -n $job && $job != unknown ]]; then
    if pgrep -f -- "$program $backend" >/dev/null 2>&1; then
      for pid in $(pgrep -f -- "$program $backend"); do
        [[ $(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -c "^TUTTI_JOB_ID=$job$") -gt 0 ]] || continue
        left+=" process $pid"
        kill -9 "$pid" 2>/dev/null
      done
    fi
    if compgen -G "/dev/shm/tutti-$job*" >/dev/null; then
      left+=" $(echo /dev/shm/tutti-"$job"*)"
      rm -f /dev/shm/tutti-"$job"*
    fi
  else
    left+=" (job id unknown)"
  fi
  compgen -G "$dir/tmp/*" >/dev/null && left+=" $(echo "$dir"/tmp/*)"
  check "$name: nothing left behind" "$([[ -z $left ]] && echo 0 || echo 1)" "$left"
done
finish
