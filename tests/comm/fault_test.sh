#!/usr/bin/env bash
# Faults under tutti-run: a killed rank, a stopped rank, mismatched calls, a rogue connection.
# Usage: fault_test.sh TUTTI_RUN FAULT_PROGRAM TRANSPORT
# Each case is bounded by `timeout`; afterwards no process of the job and no /dev/shm segment of
# it may be left.
set -u
run=$1 program=$2 transport=$3
passed=0 failed=0
check() {  # NAME CONDITION-DESCRIPTION RESULT(0=ok)
  if [[ $3 -eq 0 ]]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1: $2"; failed=$((failed + 1)); fi
}
leftovers() {
  pgrep -x "$(basename "$program")" >/dev/null && return 0
  compgen -G "/dev/shm/tutti-*" >/dev/null && return 0
  return 1
}
# case NAME RANKS TIMEOUT_MS MODE EXPECTED-PATTERN EXPECTED-COUNT [BOUND_MS]
# BOUND_MS (default 60000) bounds the whole job: below TIMEOUT_MS, it shows that the failure was
# seen without waiting out the timeout.
case_() {
  local name=$1 n=$2 timeout_ms=$3 mode=$4 pattern=$5 want=$6 bound_ms=${7:-60000}
  local start end out status
  start=$(date +%s%N)
  out=$(timeout -s KILL 120 "$run" -n "$n" --transport "$transport" --timeout-ms "$timeout_ms" --grace-period 2 \
        "$program" "$mode" 2>&1)
  status=$?
  end=$(date +%s%N)
  local elapsed_ms=$(((end - start) / 1000000))
  local got
  got=$(grep -cE "$pattern" <<<"$out")
  check "$name: tutti-run exits non-zero" "status $status" $([[ $status -ne 0 ]] && echo 0 || echo 1)
  check "$name: $want ranks report /$pattern/" "got $got; output:
$out" $([[ $got -eq $want ]] && echo 0 || echo 1)
  check "$name: done in ${elapsed_ms} ms" "not within ${bound_ms} ms" $([[ $elapsed_ms -lt $bound_ms ]] && echo 0 || echo 1)
  sleep 0.2
  if leftovers; then
    check "$name: nothing left behind" "$(pgrep -ax "$(basename "$program")"; ls /dev/shm)" 1
    pkill -9 -x "$(basename "$program")"
  else
    check "$name: nothing left behind" "" 0
  fi
}
# A killed rank: the others raise peer_failure naming it, well before the timeout (20 s).
case_ kill 4 20000 kill 'peer_failure: .*rank 1' 3
# A rank that exits normally while the others wait for it: they raise peer_failure naming it at
# once (the job ends long before the 60 s timeout; tutti-run's grace period is 2 s).
case_ exit 3 60000 exit 'peer_failure: .*rank 1' 2 20000
# A stopped rank: the others time out (2 s), then tutti-run kills the stopped one.
case_ stop 3 2000 stop 'timeout: .*timed out' 2
for what in count type op root; do
  case_ "mismatch-$what" 3 20000 "mismatch-$what" 'mismatch: .*rank' 3
done
if [[ $transport == tcp ]]; then
  out=$(timeout -s KILL 60 "$run" -n 3 --transport tcp --timeout-ms 20000 "$program" bad-token 2>&1)
  status=$?
  check "bad-token: job unaffected (exit 0)" "status $status: $out" $([[ $status -eq 0 ]] && echo 0 || echo 1)
  check "bad-token: every rank ok" "$out" $([[ $(grep -c ": ok" <<<"$out") -eq 3 ]] && echo 0 || echo 1)
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
