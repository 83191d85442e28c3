#!/usr/bin/env bash
# tutti-train --profile and --straggler on 2 processes: the profile read_profile accepts has one
# grad line per parameter of the model (8), with its element count, f32, in backward's order (the
# last layer first); written by rank 0 alone, or by every rank with "{rank}" in the path (the
# straggler's says so); a directory that cannot be written is a usage error before training; a
# --straggler run ends with identical parameters; bad --straggler values
# and a rank outside the job are usage errors (exit 2) naming the flag. Every run is bounded by
# `timeout`.
#
#   train_profile_test.sh TUTTI_RUN TUTTI_TRAIN PROFILE_CHECK [DATA_DIR]
# Exits 77 (skipped) when the Fashion-MNIST files are not installed.
set -u
run=$1
train=$2
check=$3
data=${4:-/usr/share/datasets/fashion-mnist}
source "$(dirname "$0")/train_harness.sh"
quick=(--epochs 1 --train-samples 512 --test-samples 128 --batch-size 32 --data "$data")

# The model's parameters and element counts (tools/train/model.hpp), in named_parameters order.
expected="conv1.weight 144
conv1.bias 16
conv2.weight 4608
conv2.bias 32
fc1.weight 200704
fc1.bias 128
fc2.weight 1280
fc2.bias 10"

# Checks profile $1 (read back by profile_check_program): prints what is wrong, nothing if all is right.
check_profile() {
  local file=$1
  "$check" "$file" >"$tmp/profile" 2>"$tmp/check.err" || { echo "profile_check_program: $(cat "$tmp/check.err")"; return; }
  local grads
  grads=$(awk '$1 == "grad" { print $2, $3 }' "$tmp/profile")
  [[ $(sort <<<"$grads") == $(sort <<<"$expected") ]] || { echo "grad lines: $grads"; return; }
  awk '$1 == "grad" && $4 != "f32" { print "type " $4 " of " $2 }' "$tmp/profile"
  awk '$1 == "batch" && $2 != 32 { print "batch " $2 }' "$tmp/profile"
  awk '($1 == "forward" || $1 == "optimizer") && !($2 > 0) { print $1 " " $2 }' "$tmp/profile"
  awk '$1 == "grad" { s += $5 } END { if (!(s > 0)) print "no backward time" }' "$tmp/profile"
  # Backward's order: fc2, fc1, conv2, conv1 (a layer's weight and bias in either order).
  local layers
  layers=$(awk '$1 == "grad" { sub(/\..*/, "", $2); if ($2 != last) printf "%s ", $2; last = $2 }' "$tmp/profile")
  [[ $layers == "fc2 fc1 conv2 conv1 " ]] || echo "layers in the order $layers"
}

case_profile_rank0() {
  train_run 2 "${quick[@]}" --profile "$tmp/p.txt"
  [[ $status -eq 0 ]] || { fail profile "exit status $status"; return; }
  [[ -f $tmp/p.txt ]] || { fail profile "no profile file"; return; }
  local wrong
  wrong=$(check_profile "$tmp/p.txt")
  [[ -z $wrong ]] || { fail profile "$wrong"; return; }
  grep -q '^note measured by tutti-train on rank 0 of 2: .*overlap on' "$tmp/p.txt" || { fail profile "no note"; return; }
  [[ $(find "$tmp" -name 'p.txt*' | wc -l) -eq 1 ]] || { fail profile "files besides p.txt: $(ls "$tmp")"; return; }
  ok profile
}

case_profile_every_rank() {
  train_run 2 "${quick[@]}" --no-overlap --straggler 1:2 --profile "$tmp/r{rank}.txt"
  [[ $status -eq 0 ]] || { fail profile-every-rank "exit status $status"; return; }
  grep -q 'tutti-train: parameters identical on all 2 ranks' "$tmp/out" ||
    { fail profile-every-rank "no 'parameters identical' line"; return; }
  local r wrong
  for r in 0 1; do
    [[ -f $tmp/r$r.txt ]] || { fail profile-every-rank "no profile of rank $r"; return; }
    wrong=$(check_profile "$tmp/r$r.txt")
    [[ -z $wrong ]] || { fail profile-every-rank "rank $r: $wrong"; return; }
    grep -q "^note measured by tutti-train on rank $r of 2: .*overlap off" "$tmp/r$r.txt" ||
      { fail profile-every-rank "rank $r: no note naming it"; return; }
    grep -q "^note --straggler 1:2 (" "$tmp/r$r.txt" || { fail profile-every-rank "rank $r: no straggler note"; return; }
  done
  ok profile-every-rank
}

case_straggler_bad() {
  local v
  for v in 1 1:0.5 1:0 x:2 -1:2 1:nan 1:inf 1: :2; do
    train_run 1 "${quick[@]}" --straggler "$v"
    [[ $status -eq 2 ]] || { fail straggler-bad "--straggler $v: exit status $status, expected 2"; return; }
    grep -q -- '--straggler' "$tmp/err" || { fail straggler-bad "--straggler $v: no message naming the flag"; return; }
  done
  train_run 2 "${quick[@]}" --straggler 2:1.5
  [[ $status -eq 2 ]] || { fail straggler-bad "rank 2 of 2: exit status $status, expected 2"; return; }
  grep -q -- '--straggler: rank 2 is not in a job of 2 ranks' "$tmp/err" ||
    { fail straggler-bad "rank 2 of 2: no message naming the flag"; return; }
  ok straggler-bad
}

# A directory that cannot be written is found before training, on every rank that writes.
case_profile_unwritable() {
  train_run 2 "${quick[@]}" --profile "$tmp/none/p.txt"
  [[ $status -eq 2 ]] || { fail profile-unwritable "exit status $status, expected 2"; return; }
  grep -q -- "--profile: rank 0 cannot write to '$tmp/none': No such file or directory" "$tmp/err" ||
    { fail profile-unwritable "no message naming the flag, the rank and the directory"; return; }
  grep -q 'epoch' "$tmp/out" && { fail profile-unwritable "it trained before failing"; return; }
  train_run 2 "${quick[@]}" --profile "$tmp/none/r{rank}.txt"
  [[ $status -eq 2 && $(grep -c -- '--profile: rank [01] cannot write' "$tmp/err") -eq 2 ]] ||
    { fail profile-unwritable "{rank}: exit status $status, expected 2 and a message from each rank"; return; }
  ok profile-unwritable
}

case_profile_rank0
case_profile_every_rank
case_profile_unwritable
case_straggler_bad

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
