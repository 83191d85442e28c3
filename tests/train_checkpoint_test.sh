#!/usr/bin/env bash
# tutti-train's checkpoints on 2 processes: a run with checkpoints ends with the same parameters as
# one without (async and blocking); a run resumed from any of its checkpoints (mid-epoch, at an
# epoch's end, after a shorter run) ends with the bitwise same parameters as the uninterrupted run;
# a rank killed (SIGKILL) while writing its shard leaves no complete-looking checkpoint, and
# --resume goes on from the previous one; a damaged shard is refused; --resume with none starts
# afresh; flags that do not go together are usage errors. Every run is bounded by `timeout`; the
# killed job leaves no process and no /dev/shm segment behind.
#
#   train_checkpoint_test.sh PATH/TO/tutti-run PATH/TO/tutti-train [DATA_DIR]
# Exits 77 (skipped) when the Fashion-MNIST files are not installed.
set -u
run=$1
train=$2
data=${3:-/usr/share/datasets/fashion-mnist}
job_pid=
# shellcheck source=train_harness.sh
source "$(dirname "$0")/train_harness.sh"  # $tmp, passed/failed, ok, fail; exits 77 without the data
cleanup() {
  [[ -n $job_pid ]] && kill -9 "$job_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# 8 steps per epoch per rank (512 samples / 2 ranks / 32).
quick=(--train-samples 512 --test-samples 256 --batch-size 32 --lr 0.05 --data "$data")
# This test's runs: always 2 ranks and the quick settings (replaces the harness's train_run).
train_run() {
  timeout -s KILL 300 "$run" -n 2 "$train" "${quick[@]}" "$@" >"$tmp/out" 2>"$tmp/err"
  status=$?
}
checksum() { grep -o 'parameters identical on all 2 ranks (checksum 0x[0-9a-f]*' "$tmp/out" | grep -o '0x[0-9a-f]*$'; }
# A run that must end with the reference parameters.
expect_reference() {
  local name=$1
  shift
  train_run "$@"
  [[ $status -eq 0 ]] || { fail "$name" "exit status $status"; return 1; }
  [[ $(checksum) == "$reference" ]] || { fail "$name" "checksum $(checksum), uninterrupted $reference"; return 1; }
  return 0
}
# A directory holding only the checkpoints of $1 at the given optimizer steps.
only() {
  local from=$1 to=$2 step
  shift 2
  rm -rf "$to"
  mkdir -p "$to"
  for step in "$@"; do cp -r "$from/$(printf 'step-%08d' "$step")" "$to/"; done
}

train_run --epochs 2
reference=$(checksum)
[[ $status -eq 0 && -n $reference ]] || { fail reference "the uninterrupted run failed ($status)"; exit 1; }

case_resume() {
  expect_reference "checkpointing changes nothing (async)" --epochs 2 --checkpoint "$tmp/a" --checkpoint-every 5 || return
  [[ -f $tmp/a/step-00000005/MANIFEST && -f $tmp/a/step-00000010/MANIFEST && -f $tmp/a/step-00000015/MANIFEST ]] ||
    { fail resume "not every checkpoint is published: $(ls -R "$tmp/a" | tr '\n' ' ')"; return; }
  expect_reference "checkpointing changes nothing (blocking)" --epochs 2 --checkpoint "$tmp/b" --checkpoint-every 4 \
    --checkpoint-blocking || return
  local step
  for step in 5 10; do  # mid-epoch 1; epoch 2, step 2
    only "$tmp/a" "$tmp/r" "$step"
    expect_reference "resume from step $step" --epochs 2 --resume "$tmp/r" || return
    grep -q "resumed from $tmp/r/$(printf 'step-%08d' "$step")" "$tmp/out" ||
      { fail resume "no 'resumed from' line for step $step"; return; }
  done
  only "$tmp/b" "$tmp/r" 4 8  # the latest, 8, ends epoch 1: epoch 2 starts afresh
  expect_reference "resume at an epoch's end" --epochs 2 --resume "$tmp/r" || return
  grep -q "resumed from $tmp/r/step-00000008 (epoch 2, step 0, optimizer step 8)" "$tmp/out" ||
    { fail resume "the latest checkpoint (step 8) was not chosen"; return; }
  # An interrupted run: one epoch, then the second resumed from where it ended.
  train_run --epochs 1 --checkpoint "$tmp/c" --checkpoint-every 8
  [[ $status -eq 0 ]] || { fail resume "one epoch: exit status $status"; return; }
  expect_reference "one epoch, then resumed" --epochs 2 --resume "$tmp/c" --checkpoint "$tmp/c" \
    --checkpoint-every 8 || return
  ok resume
}

# The pids of the job's ranks (children of tutti-run, the child of timeout).
job_ranks() { local runner; for runner in $(pgrep -P "$job_pid"); do pgrep -P "$runner"; done; }
rank_pid() { # RANK
  local pid
  for pid in $(job_ranks); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "TUTTI_RANK=$1" && echo "$pid"
  done
}

# Rank 1's shard of the checkpoint at step 8 goes into a pipe that the test holds open and never
# reads: its writer fills the pipe and blocks in write(), part of the shard written. Then it is
# killed. Rank 0 has written its shard and waits for rank 1's; no MANIFEST may appear.
case_kill_during_write() {
  local dir=$tmp/k
  mkdir -p "$dir/step-00000008"
  mkfifo "$dir/step-00000008/shard-1-of-2.tmp"
  exec 3<>"$dir/step-00000008/shard-1-of-2.tmp"  # a reader that never reads
  local shm_before
  shm_before=$(ls /dev/shm)
  timeout -s KILL 300 "$run" -n 2 --grace-period 2 "$train" "${quick[@]}" --epochs 2 --checkpoint "$dir" \
    --checkpoint-every 4 >"$tmp/out" 2>"$tmp/err" 3<&- &
  job_pid=$!
  local i victim=
  for ((i = 0; i < 600; i++)); do  # until rank 0's shard is on disk (at most 60 s)
    [[ -f $dir/step-00000008/shard-0-of-2 ]] && break
    sleep 0.1
  done
  sleep 0.5
  victim=$(rank_pid 1)
  local ranks
  ranks=$(job_ranks | tr '\n' ' ')
  if [[ -z $victim || ! -f $dir/step-00000008/shard-0-of-2 ]]; then
    fail kill-during-write "rank 0's shard never appeared or rank 1 is gone (pid '$victim')"
    kill -9 "$job_pid" 2>/dev/null
    wait "$job_pid" 2>/dev/null
    job_pid=
    exec 3<&-
    return
  fi
  [[ -f $dir/step-00000008/MANIFEST ]] && { fail kill-during-write "a MANIFEST before rank 1's shard"; }
  kill -9 "$victim"
  wait "$job_pid"
  local job_status=$?
  job_pid=
  exec 3<&-
  [[ $job_status -ne 0 ]] || { fail kill-during-write "the job exited 0 after a rank was killed"; return; }
  grep -q 'rank 1 (pid [0-9]*) killed by signal 9' "$tmp/err" || { fail kill-during-write "rank 1 was not killed"; return; }
  # Rank 0 learns it from its checkpoint writer, at its next checkpoint call.
  grep -q '^\[0\] tutti-train: error: .*rank 1' "$tmp/err" || { fail kill-during-write "rank 0 did not report it"; return; }
  local pid
  for pid in $ranks; do
    kill -0 "$pid" 2>/dev/null && { fail kill-during-write "rank process $pid is left"; return; }
  done
  local leftover
  leftover=$(comm -13 <(echo "$shm_before") <(ls /dev/shm) | grep '^tutti-')
  [[ -z $leftover ]] || { fail kill-during-write "/dev/shm segments left: $leftover"; return; }
  [[ ! -e $dir/step-00000008/MANIFEST && ! -e $dir/step-00000008/shard-1-of-2 ]] ||
    { fail kill-during-write "step 8 looks complete: $(ls "$dir/step-00000008" | tr '\n' ' ')"; return; }
  [[ -f $dir/step-00000004/MANIFEST ]] || { fail kill-during-write "step 4 was not published"; return; }
  rm -f "$dir/step-00000008/shard-1-of-2.tmp"  # the pipe; a crash leaves a plain partial file
  expect_reference "kill-during-write: resumed" --epochs 2 --resume "$dir" || return
  grep -q "resumed from $dir/step-00000004 " "$tmp/out" ||
    { fail kill-during-write "did not resume from step 4: $(grep resumed "$tmp/out")"; return; }
  ok kill-during-write
}

case_damaged() {
  only "$tmp/a" "$tmp/d" 10
  local shard=$tmp/d/step-00000010/shard-1-of-2
  printf '\x55' | dd of="$shard" bs=1 seek=4000 conv=notrunc status=none
  train_run --epochs 2 --resume "$tmp/d"
  [[ $status -eq 1 ]] || { fail damaged "exit status $status, expected 1"; return; }
  grep -q "shard $shard is damaged: checksum mismatch\|shard $shard is damaged: it is not the shard its MANIFEST names" \
    "$tmp/err" || { fail damaged "no error naming the damaged shard"; return; }
  ok damaged
}

case_none() {
  mkdir -p "$tmp/empty/step-00000003"  # never completed
  expect_reference "none to resume" --epochs 2 --resume "$tmp/empty" || return
  grep -q "no complete checkpoint in $tmp/empty: starting from the beginning" "$tmp/out" ||
    { fail none "no message saying there is none"; return; }
  ok none
}

case_usage() {
  local args
  for args in "--checkpoint $tmp/u" "--checkpoint-every 3" "--checkpoint-blocking" \
    "--checkpoint $tmp/u --checkpoint-every 3 --compression qsgd:8" "--resume $tmp/u --compression topk:0.1"; do
    # shellcheck disable=SC2086
    train_run $args
    [[ $status -eq 2 ]] || { fail usage "$args: exit status $status, expected 2"; return; }
  done
  ok usage
}

case_resume
case_kill_during_write
case_damaged
case_none
case_usage

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
