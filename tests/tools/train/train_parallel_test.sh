#!/usr/bin/env bash
# tutti-train beyond data parallelism, end to end: for every layout (data, pipeline GPipe and 1F1B,
# tensor, their grid, ZeRO 1 and 2), the loss of each of the first 20 steps (--loss-log) against a
# single-rank run on the same global batch: within 1e-5 relative, and bit for bit where the
# arithmetic is the same (a pipeline of one micro-batch, out of core under a budget that swaps). Every run ends with identical parameters
# in each data-parallel group; pipeline runs report their idle share. Layouts that do not fit the
# job are a usage error (exit 2) naming the problem, on every rank, before training.
#
#   train_parallel_test.sh PATH/TO/tutti-run PATH/TO/tutti-train [DATA_DIR]
# Exits 77 (skipped) when the Fashion-MNIST files are not installed.
set -u
run=$1
train=$2
data=${3:-/usr/share/datasets/fashion-mnist}
source "$(dirname "$0")/train_harness.sh"
# 20 steps of a global batch of 128. lr 0.01: at 0.02 and above the first steps' dynamics amplify
# rounding differences (1e-7) to 1e-4 within 20 steps (measured), whatever the layout.
global=128
common=(--epochs 1 --train-samples $((20 * global)) --test-samples 500 --lr 0.01 --data "$data")

# The reference: one rank, the whole global batch.
timeout -s KILL 300 "$train" "${common[@]}" --batch-size $global --loss-log "$tmp/reference" >"$tmp/out" 2>"$tmp/err"
status=$?
if [[ $status -ne 0 || $(grep -vc '^#' "$tmp/reference") -ne 20 ]]; then
  fail reference "exit status $status, or not 20 steps in the loss log"
  echo "passed $passed, failed $failed"
  exit 1
fi
ok reference

# compare NAME: the loss log in $tmp/loss against the reference; prints the largest relative difference.
compare() {
  awk 'NR == FNR { if ($1 !~ /^#/) want[$1 " " $2] = $3; next }
       $1 !~ /^#/ { n++; key = $1 " " $2; if (!(key in want)) { print "step " key " not in the reference"; exit 1 }
                    d = ($3 - want[key]) / want[key]; if (d < 0) d = -d; if (d > worst) worst = d }
       END { if (n != 20) { print n " steps, not 20"; exit 1 } printf "%.3g\n", worst }' "$tmp/reference" "$tmp/loss"
}

# layout NAME RANKS EXACT FLAGS...: trains, then checks status, parameters, the losses.
layout() {
  local name=$1 ranks=$2 exact=$3
  shift 3
  train_run "$ranks" "${common[@]}" --loss-log "$tmp/loss" "$@"
  [[ $status -eq 0 ]] || { fail "$name" "exit status $status"; return; }
  grep -q '^\[0\] tutti-train: parameters identical on ' "$tmp/out" || { fail "$name" "no 'parameters identical' line"; return; }
  local worst
  worst=$(compare) || { fail "$name" "loss log: $worst"; return; }
  if [[ $exact == exact ]]; then
    cmp -s "$tmp/reference" "$tmp/loss" || { fail "$name" "not bit for bit the reference's losses (worst $worst)"; return; }
  fi
  awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' || { fail "$name" "a step's loss differs by $worst relative (> 1e-5)"; return; }
  if grep -q -- '--pipeline' <<<"$*"; then
    local idle
    idle=$(grep -c '^\[0\] tutti-train: rank [0-9]* params_mb=.* idle=0\.[0-9]*$' "$tmp/out")
    [[ $idle -eq $ranks ]] || { fail "$name" "$idle of $ranks ranks report their idle share"; return; }
  fi
  ok "$name (worst relative difference $worst)"
}

layout data4 4 close --batch-size 32
layout pipeline2-m1 2 exact --batch-size 128 --pipeline 2
layout pipeline4-m1 4 exact --batch-size 128 --pipeline 4
layout pipeline2xdata2-gpipe-m4 4 close --batch-size 64 --pipeline 2 --micro-batches 4 --schedule gpipe
layout pipeline2xdata2-1f1b-m8 4 close --batch-size 64 --pipeline 2 --micro-batches 8 --schedule 1f1b
layout pipeline3-1f1b-m4 3 close --batch-size 128 --pipeline 3 --micro-batches 4
layout tensor2xdata2 4 close --batch-size 64 --tensor-parallel 2
layout pipeline2xtensor2 4 close --batch-size 128 --pipeline 2 --tensor-parallel 2 --micro-batches 2
layout pipeline4xtensor2 8 close --batch-size 128 --pipeline 4 --tensor-parallel 2 --micro-batches 4
layout zero1-data4 4 close --batch-size 32 --zero 1
layout zero2-data4 4 close --batch-size 32 --zero 2
layout zero2-pipeline2xdata2 4 close --batch-size 64 --pipeline 2 --micro-batches 2 --zero 2

# ZeRO: optimizer state per rank is the owned shard, a quarter of plain data parallelism's.
case_zero_memory() {
  train_run 4 "${common[@]}" --batch-size 32 --zero 2
  local plain sharded
  sharded=$(awk '$1 == "[0]" && $3 == "rank" && $4 == "0" { sub("optimizer_state_mb=", "", $6); print $6 }' "$tmp/out")
  [[ -n $sharded ]] || { fail zero-memory "no memory line for rank 0"; return; }
  plain=$(/usr/bin/python3 -c 'print(206922 * 4 / 1e6)')  # the network's f32 parameters, in MB
  awk -v s="$sharded" -v p="$plain" 'BEGIN { exit !(s > 0 && s <= p / 4 + 0.001 && s >= p / 4 - 0.001) }' ||
    { fail zero-memory "optimizer state $sharded MB on rank 0, expected a quarter of $plain MB"; return; }
  ok "zero-memory ($sharded MB of $plain MB)"
}
case_zero_memory

# Out of core: under 8 MiB the activations and momentum swap, and the losses are bit for bit the
# reference's; the same budget without swapping is an out-of-memory error; data parallel too.
case_out_of_core() {
  layout out-of-core-8MiB 1 exact --batch-size 128 --device-memory 8
  local swapped
  swapped=$(sed -n 's/^\[0\] tutti-train: device memory (rank 0, MiB) budget=8.0 peak=\([0-9.]*\) .* swapped_out=\([0-9.]*\) .*/\1 \2/p' "$tmp/out")
  awk -v v="$swapped" 'BEGIN { split(v, a, " "); exit !(a[1] > 0 && a[1] <= 8 && a[2] > 0) }' ||
    { fail out-of-core-8MiB "peak and swapped out: '$swapped' (peak within 8 MiB, something swapped)"; }
  layout out-of-core-data2 2 close --batch-size 64 --device-memory 8
  train_run 1 "${common[@]}" --batch-size 128 --device-memory 8 --no-swap
  [[ $status -eq 1 ]] && grep -q 'out of device memory: need [0-9]*, budget 8388608, .*swapping is off' "$tmp/err" ||
    { fail no-swap "exit status $status, or no out-of-memory error naming the budget"; return; }
  ok no-swap
}
case_out_of_core

# The bubble from the timeline (tools/analyze_timeline.py --pipeline over every rank's trace)
# equals the idle share tutti-train measured itself: the same intervals, after the same 5 steps.
case_bubble_from_timeline() {
  train_run 2 "${common[@]}" --batch-size 128 --pipeline 2 --micro-batches 4 --timeline "$tmp/tl{rank}.json"
  [[ $status -eq 0 ]] || { fail bubble-from-timeline "exit status $status"; return; }
  local analysis
  analysis=$(/usr/bin/python3 "$(dirname "$0")/../../../tools/analyze_timeline.py" --pipeline --json --skip 5 \
    "$tmp/tl{rank}.json" 2>&1) || { fail bubble-from-timeline "analyze_timeline.py: $analysis"; return; }
  local problem
  problem=$(/usr/bin/python3 -c '
import json, re, sys
report = json.loads(sys.argv[1])["pipeline"]
printed = {m.group(1): float(m.group(2)) for m in re.finditer(r"rank (\d+) params_mb=.* idle=([0-9.]+)", open(sys.argv[2]).read())}
if sorted(report) != ["0", "1"] or sorted(printed) != ["0", "1"]:
    sys.exit(f"ranks {sorted(report)} in the timelines, {sorted(printed)} printed")
for rank, r in report.items():
    steps, micro, idle = r["steps"], r["micro_batches"], r["idle"]
    if steps != 15 or micro != 4:
        sys.exit(f"rank {rank}: {steps} steps of {micro} micro-batches, not 15 of 4")
    if abs(idle - printed[rank]) > 0.005:
        sys.exit(f"rank {rank}: idle {idle:.4f} from the timeline, {printed[rank]} printed")
' "$analysis" "$tmp/out" 2>&1) || { fail bubble-from-timeline "$problem"; return; }
  ok bubble-from-timeline
}
case_bubble_from_timeline

# refused LABEL RANKS MESSAGE FLAGS...: exit 2, MESSAGE on stderr, nothing trained.
refused() {
  local name=$1 ranks=$2 message=$3
  shift 3
  train_run "$ranks" "${common[@]}" "$@"
  [[ $status -eq 2 ]] || { fail "$name" "exit status $status, expected 2"; return; }
  grep -qF -- "$message" "$tmp/err" || { fail "$name" "stderr does not say: $message"; return; }
  ! grep -q 'epoch 1/1' "$tmp/out" || { fail "$name" "it trained"; return; }
  ok "$name"
}
refused not-a-grid 3 "3 ranks do not form a grid of pipeline 2 x tensor 1" --batch-size 64 --pipeline 2
refused empty-stage 1 "a stage would have no layers" --batch-size 64 --pipeline 5
refused tensor-split 3 "--tensor-parallel 3 does not divide fc1's 128 outputs" --batch-size 64 --tensor-parallel 3
refused micro-batches 1 "--micro-batches 3 does not divide --batch-size 64" --batch-size 64 --pipeline 2 --micro-batches 3
refused micro-batches-alone 1 "--micro-batches needs --pipeline N" --batch-size 64 --micro-batches 2
refused schedule 1 "--schedule takes gpipe or 1f1b" --batch-size 64 --pipeline 2 --schedule zigzag
refused zero-stage 1 "--zero takes 1 or 2" --batch-size 64 --zero 3
refused out-of-core-pipeline 2 "--device-memory trains the whole network on each rank" --batch-size 64 --pipeline 2 \
  --device-memory 64

echo "passed $passed, failed $failed"
[[ $failed -eq 0 ]]
