#!/usr/bin/env bash
# tutti-train end to end on 2 processes: a short run converges and ends with identical parameters
# on both ranks and a valid timeline; the same without overlap and with every compressor; a bad
# flag (exit 2); a missing and a damaged data set (exit 1, naming the path). Every run is bounded
# by `timeout`.
#
#   train_test.sh PATH/TO/tutti-run PATH/TO/tutti-train [DATA_DIR]
# Exits 77 (skipped) when the Fashion-MNIST files are not installed.
set -u
run=$1
train=$2
data=${3:-/usr/share/datasets/fashion-mnist}
source "$(dirname "$0")/train_harness.sh"
quick=(--epochs 2 --train-samples 512 --test-samples 256 --batch-size 32 --lr 0.05 --data "$data")
# The value after `word` on rank 0's epoch-N line.
epoch_field() { awk -v n="$1" -v w="$2" '$1 == "[0]" && $2 == "epoch" && $3 ~ "^" n "/" {
  for (i = 1; i < NF; i++) if ($i == w) { v = $(i + 1); sub(/%$/, "", v); print v } }' "$tmp/out"; }

# Status 0, one epoch line per epoch, the loss falls, parameters identical, summary line.
check_training() {
  local name=$1
  [[ $status -eq 0 ]] || { fail "$name" "exit status $status"; return 1; }
  grep -q '^\[0\] tutti-train: parameters identical on all 2 ranks (checksum 0x[0-9a-f]\{16\})$' "$tmp/out" ||
    { fail "$name" "no 'parameters identical' line"; return 1; }
  local loss1 loss2
  loss1=$(epoch_field 1 loss)
  loss2=$(epoch_field 2 loss)
  [[ -n $loss1 && -n $loss2 ]] || { fail "$name" "no epoch lines with a loss"; return 1; }
  awk -v a="$loss1" -v b="$loss2" 'BEGIN { exit !(b < a) }' ||
    { fail "$name" "the loss did not fall: epoch 1 $loss1, epoch 2 $loss2"; return 1; }
  grep -q '^\[0\] tutti-train: summary step_ms=[0-9.]* samples_per_s=[0-9]* hidden=[0-9.]* overlapped=[0-9.]* test_acc=[0-9.]* loss=[0-9.]*$' \
    "$tmp/out" || { fail "$name" "no summary line"; return 1; }
  [[ $(grep -c 'tutti-train: summary' "$tmp/out") -eq 1 ]] || { fail "$name" "the summary is not printed once"; return 1; }
  return 0
}

case_overlap() {
  train_run 2 "${quick[@]}" --timeline "$tmp/tl.json"
  check_training overlap || return
  [[ -s $tmp/tl.json ]] || { fail overlap "no timeline file"; return; }
  local missing
  missing=$(/usr/bin/python3 -c '
import json, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
names = {e.get("name") for e in events}
print(" ".join(n for n in ("BACKWARD", "ALLREDUCE", "NEGOTIATE") if n not in names))' "$tmp/tl.json" 2>&1) ||
    { fail overlap "the timeline is not valid JSON: $missing"; return; }
  [[ -z $missing ]] || { fail overlap "the timeline has no $missing events"; return; }
  ok overlap
}

case_no_overlap() {
  train_run 2 "${quick[@]}" --no-overlap
  check_training no-overlap || return
  grep -q '^\[0\] tutti-train: p=2 .* overlap=off ' "$tmp/out" || { fail no-overlap "header does not say overlap=off"; return; }
  # Gradients are enqueued only after backward: nothing can be hidden behind it.
  local hidden
  hidden=$(epoch_field 2 hidden)
  awk -v h="$hidden" 'BEGIN { exit !(h != "" && h <= 5) }' || { fail no-overlap "hidden $hidden%, expected about 0"; return; }
  # Every allreduce call starts after backward ended.
  local overlapped
  overlapped=$(epoch_field 2 overlapped)
  [[ $overlapped == 0.0 ]] || { fail no-overlap "overlapped $overlapped%, expected 0.0"; return; }
  ok no-overlap
}

case_bad_flag() {
  train_run 2 --no-such-flag
  [[ $status -eq 2 ]] || { fail bad-flag "exit status $status, expected 2"; return; }
  grep -q 'unknown option --no-such-flag' "$tmp/err" || { fail bad-flag "no message naming the flag"; return; }
  train_run 1 --epochs zero
  [[ $status -eq 2 ]] || { fail bad-flag "--epochs zero: exit status $status, expected 2"; return; }
  ok bad-flag
}

case_missing_data() {
  train_run 2 --data /nonexistent
  [[ $status -eq 1 ]] || { fail missing-data "exit status $status, expected 1"; return; }
  grep -q 'tutti-train: error: /nonexistent' "$tmp/err" || { fail missing-data "no error naming /nonexistent"; return; }
  ok missing-data
}

case_damaged_data() {
  local bad=$tmp/damaged
  mkdir -p "$bad"
  cp "$data"/t10k-* "$bad"/
  # A training image file cut in the middle of its compressed stream.
  head -c 100000 "$data/train-images-idx3-ubyte.gz" >"$bad/train-images-idx3-ubyte.gz"
  cp "$data/train-labels-idx1-ubyte.gz" "$bad"/
  train_run 2 --data "$bad"
  [[ $status -eq 1 ]] || { fail damaged-data "exit status $status, expected 1"; return; }
  grep -q "tutti-train: error: $bad/train-images-idx3-ubyte.gz: " "$tmp/err" ||
    { fail damaged-data "no error naming the damaged file"; return; }
  # Labels that do not match the images.
  cp "$data/train-images-idx3-ubyte.gz" "$bad"/
  cp "$data/t10k-labels-idx1-ubyte.gz" "$bad/train-labels-idx1-ubyte.gz"
  train_run 1 --data "$bad"
  if [[ $status -ne 1 ]] || ! grep -q "train-labels-idx1-ubyte.gz: 10000 labels for 60000 images" "$tmp/err"; then
    fail damaged-data "labels of the wrong count: status $status"
    return
  fi
  ok damaged-data
}

# Every compressor: a short run that trains (the loss falls) and ends with identical parameters
# on both ranks; the header names the compressor; two runs end with the same parameters; a
# malformed one is a usage error (exit 2).
case_compression() {
  local c all_ok=1
  for c in fp16 bf16 qsgd:8 qsgd:4 powersgd:2 topk:0.1; do
    train_run 2 "${quick[@]}" --compression "$c"
    check_training "compression $c" || { all_ok=0; continue; }
    local overlap=off
    [[ $c == fp16 || $c == bf16 ]] && overlap=on  # through the engine, overlapped with backward
    grep -q "^\[0\] tutti-train: p=2 .* overlap=$overlap compression=$c " "$tmp/out" ||
      { fail "compression $c" "header does not say overlap=$overlap compression=$c"; all_ok=0; continue; }
    echo "     compression $c: test accuracy $(epoch_field 2 test-acc)%"
  done
  # QSGD's coins come from (seed, rank, step, tensor): a second run ends with the same parameters.
  local first
  for c in qsgd:4 topk:0.1; do
    train_run 2 "${quick[@]}" --compression "$c"
    first=$(grep -o 'checksum 0x[0-9a-f]*' "$tmp/out")
    train_run 2 "${quick[@]}" --compression "$c"
    [[ -n $first && $(grep -o 'checksum 0x[0-9a-f]*' "$tmp/out") == "$first" ]] ||
      { fail "compression $c" "a second run ended with other parameters than the first ($first)"; all_ok=0; }
  done
  train_run 2 "${quick[@]}" --compression qsgd:3
  [[ $status -eq 2 ]] || { fail compression "--compression qsgd:3: exit status $status, expected 2"; return; }
  grep -q "compression 'qsgd:3': BITS must be 4 or 8" "$tmp/err" ||
    { fail compression "--compression qsgd:3: no message naming it"; return; }
  ((all_ok)) && ok compression
}

# --log-interval: rank 0 alone prints a line every N steps of an epoch (8 steps here: 512 samples
# over 2 ranks of 32); without a terminal no progress line is drawn; a negative interval is a
# usage error.
case_log_interval() {
  train_run 2 --epochs 1 --train-samples 512 --test-samples 256 --batch-size 32 --data "$data" --log-interval 3
  [[ $status -eq 0 ]] || { fail log-interval "exit status $status"; return; }
  local steps
  steps=$(grep -E '^\[0\] epoch 1/1  step [0-9]+/8  loss [0-9]+\.[0-9]{4}  samples/s [0-9]+  eta [0-9]+\.[0-9] s$' "$tmp/out" |
    awk '{ split($5, a, "/"); printf "%s ", a[1] }')
  [[ $steps == "3 6 " ]] || { fail log-interval "step lines at '$steps', expected '3 6 '"; return; }
  ! grep -q '^\[1\] epoch 1/1  step' "$tmp/out" || { fail log-interval "rank 1 printed step lines"; return; }
  ! grep -q $'\033\\[K' "$tmp/out" "$tmp/err" || { fail log-interval "a progress line without a terminal"; return; }
  train_run 1 --log-interval -1
  [[ $status -eq 2 ]] || { fail log-interval "--log-interval -1: exit status $status, expected 2"; return; }
  ok log-interval
}

case_overlap
case_log_interval
case_no_overlap
case_compression
case_bad_flag
case_missing_data
case_damaged_data

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
