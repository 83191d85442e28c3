#!/usr/bin/env bash
# The out-of-core study: for each device-memory budget, the largest --width of tutti-train's
# network that trains a few steps under it, without swapping (--no-swap) and with swapping, and
# the step-time cost of swapping. One rank, the emulated device (TUTTI_DEVICE=emulated).
#
#   scripts/out_of_core_study.sh [--budgets MB,...] [--batch B] [--steps N] [--max-width W]
#                                [--rounds K] [--threads T]
#
# Defaults: budgets 32,128 MB, batch 256, N = 10 steps per run (tutti-train leaves the first 5
# out of its step time), widths searched from 1 to W = 12, K = 3 rounds, T = 1 torch thread.
# A width "trains" when tutti-train exits 0 after N steps (--train-samples N x B, one epoch, 256
# test samples); the search assumes that what fits at width w fits at every smaller width.
# The cost of swapping: at the largest width that trains with swapping, the median step time under
# the budget against the same width with a budget nothing evicts from (--device-memory 1000000),
# the two alternating round by round; the median over K rounds, with min and max of the ratio.
# Before anything else it checks that tutti-train honours --device-memory: a 1 MB budget must fail.
# The build: $TUTTI_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
budgets=32,128 batch=256 steps=10 max_width=12 rounds=3 threads=1
usage() { sed -n '2,19s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case $1 in
    --budgets | --batch | --steps | --max-width | --rounds | --threads)
      (($# >= 2)) || { echo "out_of_core_study.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --budgets) budgets=$2 ;; --batch) batch=$2 ;; --steps) steps=$2 ;; --max-width) max_width=$2 ;;
        --rounds) rounds=$2 ;; --threads) threads=$2 ;;
      esac
      shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "out_of_core_study.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for v in batch steps max_width rounds threads; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "out_of_core_study.sh: --${v//_/-} must be a positive integer" >&2; exit 2; }
done
((steps > 6)) || { echo "out_of_core_study.sh: --steps must be more than 6 (5 are warm-up)" >&2; exit 2; }
[[ $budgets =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "out_of_core_study.sh: --budgets MB,MB,..." >&2; exit 2; }
build=${TUTTI_BUILD_DIR:-build}
train=$build/tools/train/tutti-train
run=$build/tools/tutti-run
for tool in "$train" "$run"; do
  [[ -x $tool ]] || { echo "out_of_core_study.sh: no $tool (set TUTTI_BUILD_DIR)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TUTTI_DEVICE=emulated

# train WIDTH MB [FLAGS...]: one run; output in $work/out, exit status returned.
train() {
  local width=$1 mb=$2
  shift 2
  timeout -s KILL 900 "$run" -n 1 "$train" --epochs 1 --batch-size "$batch" --threads "$threads" \
    --train-samples $((steps * batch)) --test-samples 256 --width "$width" --device-memory "$mb" "$@" \
    >"$work/out" 2>&1
}
# step_ms: the step time tutti-train's summary line printed for the last run.
step_ms() { sed -n 's/.*summary step_ms=\([0-9.]*\).*/\1/p' "$work/out"; }

if train 1 1; then
  echo "out_of_core_study.sh: tutti-train trained under a 1 MB budget: it ignores --device-memory" >&2
  exit 1
fi

# largest MB [FLAGS...]: the largest width in 1..max_width that trains (0: none), by doubling
# then bisection.
largest() {
  local mb=$1
  shift
  local good=0 bad=$((max_width + 1)) w=1
  while ((w <= max_width)) && train "$w" "$mb" "$@"; do
    good=$w
    w=$((w * 2))
  done
  ((w <= max_width)) && bad=$w
  while ((bad - good > 1)); do
    w=$(((good + bad) / 2))
    if train "$w" "$mb" "$@"; then good=$w; else bad=$w; fi
  done
  echo "$good"
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "out-of-core study: batch $batch, $steps steps per run, $threads torch thread(s), emulated device," \
  "$(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| budget MB | largest width, no swap | largest width, swap | step ms at that width: budget / unbounded (median of $rounds) | cost (min to max) | swap counters (last run) |"
echo "| --- | --- | --- | --- | --- | --- |"
IFS=, read -r -a budget_list <<<"$budgets"
for mb in "${budget_list[@]}"; do
  no_swap=$(largest "$mb" --no-swap)
  swap=$(largest "$mb")
  if ((swap == 0)); then
    echo "| $mb | $no_swap | $swap | - | - | - |"
    continue
  fi
  : >"$work/bounded"
  : >"$work/unbounded"
  : >"$work/ratios"
  for ((r = 0; r < rounds; ++r)); do
    train "$swap" "$mb" || { echo "out_of_core_study.sh: width $swap under $mb MB failed in round $r" >&2; exit 1; }
    bounded=$(step_ms)
    counters=$(grep -o 'swapped.*' "$work/out" | tail -1 || true)
    train "$swap" 1000000 || { echo "out_of_core_study.sh: width $swap unbounded failed in round $r" >&2; exit 1; }
    unbounded=$(step_ms)
    echo "$bounded" >>"$work/bounded"
    echo "$unbounded" >>"$work/unbounded"
    awk -v a="$bounded" -v b="$unbounded" 'BEGIN {printf "%.3f\n", a / b}' >>"$work/ratios"
  done
  cost=$(median <"$work/ratios")
  range=$(sort -g "$work/ratios" | sed -n '1p;$p' | paste -sd' ')
  echo "| $mb | $no_swap | $swap | $(median <"$work/bounded") / $(median <"$work/unbounded") | x$cost (${range% *} to ${range#* }) | ${counters:--} |"
done
