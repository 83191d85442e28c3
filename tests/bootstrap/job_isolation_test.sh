#!/usr/bin/env bash
# Jobs that share one file:// store directory stay apart: concurrent jobs with distinct ids (2 and
# 3 jobs, shm and tcp) each see their own ranks only; jobs with no id refuse to start, naming
# TUTTI_JOB_ID; a directory reused by a later job, a job run again with the same id (a requeue,
# with other hosts this time), and a run after an earlier run died half-way all start cleanly.
# Ranks are started by hand, as a launcher of one's own would, with the test program's job-sum
# mode: each rank adds its job's tag and checks the world size and the sum.
#
#   job_isolation_test.sh FAULT_PROGRAM
set -uo pipefail
program=$1
source "$(dirname "$0")/../lib.sh"
dir=$scratch
at_exit 'rm -f /dev/shm/tutti-iso"$$"-* 2>/dev/null'

# start_rank OUT RANK SIZE TAG TRANSPORT [VAR=VALUE...]: one rank in the background.
start_rank() {
  local out=$1 rank=$2 size=$3 tag=$4 transport=$5
  shift 5
  env -u TUTTI_JOB_ID TUTTI_RANK="$rank" TUTTI_SIZE="$size" TUTTI_STORE="file://$dir" TUTTI_TOKEN=isolation-token \
    TUTTI_TRANSPORT="$transport" TUTTI_TIMEOUT_MS=${TIMEOUT_MS:-20000} JOB_TAG="$tag" "$@" \
    timeout -s KILL 60 "$program" job-sum >"$out" 2>&1 &
  pids+=($!)
}

# jobs NAME TRANSPORT SIZE ID... : starts one job per id at once (ids "-" mean none), waits, and
# checks that every rank of every job reported its own job's sum.
concurrent_jobs() {
  local name=$1 transport=$2 size=$3 j=0 r
  shift 3
  local first=${#pids[@]}
  for id in "$@"; do
    j=$((j + 1))
    for ((r = size - 1; r >= 0; r--)); do  # the last rank first: it reads keys before rank 0 writes them
      sleep "${STAGGER:-0}"
      if [[ $id == - ]]; then
        start_rank "$dir/$name.$j.$r" "$r" "$size" $((1000003 * j)) "$transport"
      else
        start_rank "$dir/$name.$j.$r" "$r" "$size" $((1000003 * j)) "$transport" TUTTI_JOB_ID="$id"
      fi
    done
  done
  local status=0
  for pid in "${pids[@]:first}"; do wait "$pid" || status=1; done
  j=0
  for id in "$@"; do
    j=$((j + 1))
    for ((r = 0; r < size; r++)); do
      grep -qx "rank $r: ok job $((1000003 * j))" "$dir/$name.$j.$r" || status=1
    done
  done
  check "$name" "$status" "$(tail -n 3 "$dir/$name".* 2>&1)"
}

for transport in shm tcp; do
  concurrent_jobs "two jobs with ids, $transport" "$transport" 2 "iso$$-a-$transport" "iso$$-b-$transport"
  concurrent_jobs "three jobs with ids, $transport, 3 ranks" "$transport" 3 \
    "iso$$-c-$transport" "iso$$-d-$transport" "iso$$-e-$transport"
done

# No id: every rank refuses, naming TUTTI_JOB_ID (none may report a sum).
first=${#pids[@]}
for j in 1 2; do
  for r in 0 1; do start_rank "$dir/noid.$j.$r" "$r" 2 "$j" shm; done
done
for pid in "${pids[@]:first}"; do wait "$pid"; done
refused=0
for f in "$dir"/noid.*; do
  grep -q "no job id" "$f" && grep -q "TUTTI_JOB_ID" "$f" && ! grep -q ": ok" "$f" || refused=1
done
check "two jobs without an id refuse to start, naming TUTTI_JOB_ID" "$refused" "$(cat "$dir"/noid.* 2>&1)"

# A directory reused by a later job (other id) over TCP: the earlier job's addresses are dead.
concurrent_jobs "an earlier job over tcp" tcp 2 "iso$$-early"
STAGGER=1 concurrent_jobs "a later job in the same directory" tcp 2 "iso$$-late"

# A job run again with the same id, as a requeue does: first as two emulated hosts (TCP between
# them), then on one host (shared memory); the second run must not read the first's host keys.
first=${#pids[@]}
for r in 0 1; do start_rank "$dir/requeue1.$r" "$r" 2 7 "" TUTTI_JOB_ID="iso$$-requeue" TUTTI_HOST="host$r"; done
for pid in "${pids[@]:first}"; do wait "$pid"; done
STAGGER=1 concurrent_jobs "the same id run again, on one host" "" 2 "iso$$-requeue"

# An earlier run that died half-way (rank 1 never came; rank 0 timed out) leaves its keys behind.
first=${#pids[@]}
TIMEOUT_MS=1000 start_rank "$dir/halfway.0" 0 2 5 shm TUTTI_JOB_ID="iso$$-halfway"
for pid in "${pids[@]:first}"; do wait "$pid"; done
concurrent_jobs "a run after a run that died half-way" shm 2 "iso$$-halfway"
first=${#pids[@]}
TIMEOUT_MS=1000 start_rank "$dir/halfway.1" 1 2 5 shm TUTTI_JOB_ID="iso$$-halfway1"
for pid in "${pids[@]:first}"; do wait "$pid"; done
concurrent_jobs "a run after a run whose rank 0 never came" shm 2 "iso$$-halfway1"

finish
