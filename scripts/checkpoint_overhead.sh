#!/usr/bin/env bash
# The step-time cost of tutti-train's checkpoints: no checkpoint, a checkpoint every N optimizer
# steps written in the background (--checkpoint), and the same written before training goes on
# (--checkpoint-blocking), alternating run by run in each round, the order rotating from round to
# round (BENCHMARKS.md: ratios measured side by side). The step time is tutti-train's (forward +
# backward + step + the checkpoint call, mean over the epoch after warm-up, rank 0); the report
# gives each mode's median over the rounds, min and max, and its ratio to no checkpoint in the same
# round. Beside it, the training thread's mean time inside one checkpoint call (tutti-train's
# `checkpoints` line): the direct cost, which the step times of a loaded machine may drown.
#
#   scripts/checkpoint_overhead.sh [-b BUILD_DIR] [-r ROUNDS] [-n EVERY] [-p RANKS] [-- TRAIN_FLAGS...]
#
# Defaults: build/, 5 rounds, every 10 steps, 2 ranks, one epoch of 12,800 samples at batch 64
# (100 steps per epoch at p = 2). Checkpoints go to a temporary directory (removed at the end;
# TMPDIR picks its file system).
set -euo pipefail
build=build rounds=5 every=10 ranks=2
while getopts "b:r:n:p:" opt; do
  case $opt in
    b) build=$OPTARG ;;
    r) rounds=$OPTARG ;;
    n) every=$OPTARG ;;
    p) ranks=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
run=$build/tools/tutti-run
train=$build/tools/train/tutti-train
[[ -x $run && -x $train ]] || { echo "no $run or $train (build tutti-run and tutti-train)" >&2; exit 2; }
flags=(--epochs 1 --train-samples 12800 --test-samples 1000 --batch-size 64 "$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Runs one mode; prints its step time and its mean checkpoint call (0 without), in ms.
step_ms() {
  local mode=$1 dir=$tmp/ckpt-$RANDOM$RANDOM extra=()
  case $mode in
    async) extra=(--checkpoint "$dir" --checkpoint-every "$every") ;;
    blocking) extra=(--checkpoint "$dir" --checkpoint-every "$every" --checkpoint-blocking) ;;
  esac
  local out
  out=$(timeout -s KILL 600 "$run" -n "$ranks" "$train" "${flags[@]}" "${extra[@]}")
  rm -rf "$dir"
  local step call
  step=$(grep -o 'summary step_ms=[0-9.]*' <<<"$out" | cut -d= -f2)
  call=$(grep -o 'call_ms=[0-9.]*' <<<"$out" | cut -d= -f2)
  echo "$step ${call:-0}"
}

echo "# tutti-train checkpoint overhead: p=$ranks, a checkpoint every $every optimizer steps, $rounds rounds"
echo "# flags: ${flags[*]}"
echo "# machine: $(nproc) cores, $(uname -n), checkpoints on $(df -P "$tmp" | awk 'NR == 2 { print $1 }')"
printf '%-6s %10s %18s %18s\n' round none_ms "async_ms (call)" "blocking_ms (call)"
results=$tmp/results
modes=(none async blocking)
for ((r = 1; r <= rounds; r++)); do
  declare -A got=()
  for ((k = 0; k < 3; k++)); do
    mode=${modes[$(((r - 1 + k) % 3))]}
    got[$mode]=$(step_ms "$mode")
  done
  read -r none _ <<<"${got[none]}"
  read -r async async_call <<<"${got[async]}"
  read -r blocking blocking_call <<<"${got[blocking]}"
  printf '%-6s %10s %18s %18s\n' "$r" "$none" "$async ($async_call)" "$blocking ($blocking_call)"
  echo "$none $async $blocking $async_call $blocking_call" >>"$results"
  unset got
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = [list(map(float, line.split())) for line in open(sys.argv[1])]
none = [r[0] for r in rows]
for i, name in enumerate(("none", "async", "blocking")):
    times = [r[i] for r in rows]
    ratios = [r[i] / r[0] for r in rows]
    print(f"{name:9s} step median {statistics.median(times):7.2f} ms (min {min(times):.2f}, max {max(times):.2f})"
          f"  vs none: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
for i, name in ((3, "async"), (4, "blocking")):
    calls = [r[i] for r in rows]
    print(f"{name:9s} checkpoint call median {statistics.median(calls):.3f} ms (min {min(calls):.3f}, max {max(calls):.3f})"
          f" on the training thread, once per checkpoint")
EOF
