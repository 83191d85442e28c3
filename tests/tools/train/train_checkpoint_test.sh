#!/usr/bin/env bash
# tutti-train's checkpoints on 2 processes: a run with checkpoints ends with the same parameters as
# one without (async and blocking); a run resumed from any of its checkpoints (mid-epoch, at an
# epoch's end, after a shorter run) ends with the bitwise same parameters as the uninterrupted run;
# the same with top-k and QSGD (the checkpoint holds the compressor's state);
# a rank killed (SIGKILL) while writing its shard leaves no complete-looking checkpoint, and
# --resume goes on from the previous one (and checkpoints over the killed one's leftovers); a
# damaged shard is refused; a damaged newest MANIFEST is named in a warning and the older
# checkpoint used; --resume with none starts afresh, --resume of a directory that does not exist
# is an error; flags that do not go together are usage errors. Every run is bounded by `timeout`;
# the killed job leaves no process and no /dev/shm segment behind.
#
#   train_checkpoint_test.sh PATH/TO/tutti-run PATH/TO/tutti-train PATH/TO/libcheckpoint_stall.so [DATA_DIR]
# Exits 77 (skipped) when the Fashion-MNIST files are not installed.
set -u
run=$1
train=$2
stall=$3  # checkpoint_stall_preload.cpp: holds one rank inside the write of one file
data=${4:-/usr/share/datasets/fashion-mnist}
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

# Rank 1's writer, held by the preload, writes half of its shard of the checkpoint at step 8 and
# blocks in write(). Then it is killed. Rank 0 has written its shard and waits for rank 1's; no
# MANIFEST may appear.
case_kill_during_write() {
  local dir=$tmp/k
  local shm_before
  shm_before=$(ls /dev/shm)
  LD_PRELOAD=$stall TUTTI_STALL_RANK=1 TUTTI_STALL_FILE=/step-00000008/shard-1-of-2.tmp \
    timeout -s KILL 300 "$run" -n 2 --grace-period 2 "$train" "${quick[@]}" --epochs 2 --checkpoint "$dir" \
    --checkpoint-every 4 >"$tmp/out" 2>"$tmp/err" &
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
    return
  fi
  [[ -f $dir/step-00000008/MANIFEST ]] && { fail kill-during-write "a MANIFEST before rank 1's shard"; }
  kill -9 "$victim"
  wait "$job_pid"
  local job_status=$?
  job_pid=
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
  [[ -f $dir/step-00000008/shard-1-of-2.tmp ]] || { fail kill-during-write "no partial shard left"; return; }
  # Resumed, checkpointing into the same directory: step 8 is written again over the leftovers.
  expect_reference "kill-during-write: resumed" --epochs 2 --resume "$dir" --checkpoint "$dir" \
    --checkpoint-every 4 || return
  grep -q "resumed from $dir/step-00000004 " "$tmp/out" ||
    { fail kill-during-write "did not resume from step 4: $(grep resumed "$tmp/out")"; return; }
  [[ -f $dir/step-00000008/MANIFEST && ! -e $dir/step-00000008/shard-1-of-2.tmp ]] ||
    { fail kill-during-write "step 8 not written again: $(ls "$dir/step-00000008" | tr '\n' ' ')"; return; }
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

# The newest checkpoint's MANIFEST is damaged: a warning names it, and the one before is used.
case_damaged_manifest() {
  only "$tmp/a" "$tmp/m" 5 10
  printf 'X' | dd of="$tmp/m/step-00000010/MANIFEST" bs=1 seek=3 conv=notrunc status=none
  expect_reference "damaged MANIFEST" --epochs 2 --resume "$tmp/m" || return
  grep -q "warning: .*$tmp/m/step-00000010/MANIFEST is damaged" "$tmp/err" ||
    { fail damaged-manifest "no warning naming the damaged MANIFEST"; return; }
  grep -q "resumed from $tmp/m/step-00000005 " "$tmp/out" ||
    { fail damaged-manifest "did not resume from step 5: $(grep resumed "$tmp/out")"; return; }
  ok damaged-manifest
}

# --resume of a directory that does not exist is an error naming it, not a fresh start.
case_missing() {
  train_run --epochs 1 --resume "$tmp/missing"
  [[ $status -eq 1 ]] || { fail missing "exit status $status, expected 1"; return; }
  grep -q "checkpoint directory $tmp/missing does not exist" "$tmp/err" ||
    { fail missing "no error naming the directory"; return; }
  ok missing
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
    "--checkpoint $tmp/u --checkpoint-every 3 --elastic"; do
    # shellcheck disable=SC2086
    train_run $args
    [[ $status -eq 2 ]] || { fail usage "$args: exit status $status, expected 2"; return; }
  done
  ok usage
}

# With a compressor that keeps memory (top-k's residuals, QSGD's step): the checkpoint holds it, so
# a run resumed mid-epoch ends with the bitwise same parameters as the uninterrupted one.
case_compressed() {
  local c
  for c in topk:0.1 qsgd:8; do
    train_run --epochs 2 --compression "$c"
    local compressed_reference
    compressed_reference=$(checksum)
    [[ $status -eq 0 && -n $compressed_reference ]] || { fail compressed "$c: the uninterrupted run failed"; return; }
    train_run --epochs 1 --compression "$c" --checkpoint "$tmp/z$c" --checkpoint-every 5
    [[ $status -eq 0 ]] || { fail compressed "$c: the run with checkpoints failed ($status)"; return; }
    only "$tmp/z$c" "$tmp/r" 5
    train_run --epochs 2 --compression "$c" --resume "$tmp/r"
    [[ $status -eq 0 && $(checksum) == "$compressed_reference" ]] ||
      { fail compressed "$c: resumed from step 5: checksum $(checksum), uninterrupted $compressed_reference"; return; }
  done
  ok compressed
}

case_resume
case_compressed
case_kill_during_write
case_damaged
case_damaged_manifest
case_missing
case_none
case_usage

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
