#!/usr/bin/env bash
# The straggler and gap study (after Li, Nicolae, Wozniak and Bosilca, SC19) on the emulated
# cluster: tutti-train over hosts x workers per host x torch threads per worker x batch size, each
# configuration run without and then with --straggler, for a few alternating rounds; the timelines
# of every rank go through tools/analyze_timeline.py. Prints a Markdown table, each figure the
# median over the rounds: from the run without the straggler, the step time (slowest rank), the
# compute, the collectives' busy time and the share of it during backward, the exposed wait after
# backward (the rank that waited least), the idle gap between weight updates and the
# communication-free time of a step (and its longest window); from the pair of runs, the
# straggler's extra compute (delay), the job's step period without and with it and the share of
# the delay the pipelining hid, and the straggler's wait in step() without and with the delay and
# the share of the delay that went into it (the shares with their min and max over the rounds).
#
#   scripts/straggler_study.sh [--layouts HxR,...] [--threads T,...] [--batches B,...] [--rate RATE]
#                              [--straggler RANK:FACTOR] [--steps N] [--rounds K] [--keep DIR]
#                              [--from DIR]
#
# Defaults: layouts 2x1,2x2,4x1 (p <= 4: every rank of every host shares this machine's cores),
# threads 1,2, batches 32,128, rate 1gbit, straggler 1:2, N = 20 training steps per run (the
# first 4 are left out as warm-up; --train-samples is N x p x B), K = 3 rounds. --keep DIR keeps
# the timelines and the analyses; --from DIR analyzes the timelines an earlier --keep DIR run left
# (the same grid) instead of running. The build: $TUTTI_BUILD_DIR (default build/). Needs root
# (scripts/cluster.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
layouts=2x1,2x2,4x1 threads_list=1,2 batches=32,128 rate=1gbit straggler=1:2 steps=20 rounds=3 keep= from=
skip=4
usage() { sed -n '2,24s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case $1 in
    --layouts | --threads | --batches | --rate | --straggler | --steps | --rounds | --keep | --from)
      (($# >= 2)) || { echo "straggler_study.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --layouts) layouts=$2 ;; --threads) threads_list=$2 ;; --batches) batches=$2 ;; --rate) rate=$2 ;;
        --straggler) straggler=$2 ;; --steps) steps=$2 ;; --rounds) rounds=$2 ;; --keep) keep=$2 ;; --from) from=$2 ;;
      esac
      shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "straggler_study.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ $steps =~ ^[0-9]+$ ]] && ((steps > skip + 1)) || { echo "straggler_study.sh: --steps must be more than $((skip + 1))" >&2; exit 2; }
[[ $rounds =~ ^[0-9]+$ ]] && ((rounds >= 1)) || { echo "straggler_study.sh: --rounds must be at least 1" >&2; exit 2; }
[[ $straggler =~ ^[0-9]+:[0-9.]+$ ]] || { echo "straggler_study.sh: --straggler RANK:FACTOR, got '$straggler'" >&2; exit 2; }
build=${TUTTI_BUILD_DIR:-build}
train=$build/tools/train/tutti-train
[[ -n $from || -x $train ]] || { echo "straggler_study.sh: no $train (set TUTTI_BUILD_DIR)" >&2; exit 1; }
if [[ -n $from ]]; then
  work=$from
elif [[ -n $keep ]]; then
  mkdir -p "$keep"
  work=$keep
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
slow_rank=${straggler%%:*}

echo "straggler study: links at $rate, --straggler $straggler, $steps steps per run (first $skip left out)," \
  "$(nproc) cores shared by all ranks, ${from:+timelines from $from, }$(date -u +%Y-%m-%dT%H:%MZ)"
echo
echo "| hosts x workers | threads | batch | step ms | compute ms | collectives busy ms | during backward | exposed ms | gap ms | comm-free ms (longest) | straggler's delay ms | period ms, without -> with | hidden (min to max) | straggler's wait ms, without -> with | hidden in the wait (min to max) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"

# run NAME HOSTS RANKS THREADS BATCH [FLAGS...]: one tutti-train job; timelines NAME.{rank}.json.
run() {
  local name=$1 hosts=$2 ranks=$3 threads=$4 batch=$5
  shift 5
  local p=$((hosts * ranks))
  [[ -z $from ]] || return 0
  echo "running $name" >&2
  bash scripts/cluster.sh --hosts "$hosts" --ranks "$ranks" --rate "$rate" --timeout 900 -- \
    "$train" --epochs 1 --train-samples $((steps * p * batch)) --test-samples 100 --batch-size "$batch" \
    --threads "$threads" --timeline "$work/$name.{rank}.json" "$@" >"$work/$name.log" 2>&1 ||
    { echo "straggler_study.sh: $name failed:" >&2; tail -n 15 "$work/$name.log" >&2; return 1; }
}

# row LAYOUT THREADS BATCH JSON...: the table's row from analyze_timeline.py's --json outputs, one
# per round: each figure the median over the rounds; the hidden share with its min and max.
row() {
  /usr/bin/python3 - "$@" <<'EOF'
import json, statistics, sys
layout, threads, batch = sys.argv[1:4]
rounds = [json.load(open(path)) for path in sys.argv[4:]]
def over_rounds(figure):
    values = [v for v in (figure(r) for r in rounds) if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else (None, None, None)
def job(r, key, how):  # over the ranks of the run without the straggler
    values = [v["summary"][key] for v in r["baseline"].values() if v["summary"][key] is not None]
    return how(values) if values else None
def f(figure, scale=1.0, digits=1, suffix=""):
    v = over_rounds(figure)[0]
    return "-" if v is None else f"{v * scale:.{digits}f}{suffix}"
def spread(figure, scale=100.0):
    m, lo, hi = over_rounds(figure)
    return "-" if m is None else f"{m * scale:.0f}% ({lo * scale:.0f} to {hi * scale:.0f})"
med = statistics.median
print(f"| {layout} | {threads} | {batch} | {f(lambda r: job(r, 'step_ms', max))} | "
      f"{f(lambda r: job(r, 'compute_ms', med))} | {f(lambda r: job(r, 'busy_ms', med))} | "
      f"{f(lambda r: job(r, 'overlap', med), 100, 0, '%')} | {f(lambda r: job(r, 'exposed_ms', min))} | "
      f"{f(lambda r: job(r, 'gap_ms', med), digits=2)} | {f(lambda r: job(r, 'free_ms', med))} "
      f"({f(lambda r: job(r, 'longest_free_ms', med))}) | {f(lambda r: r['straggler']['delay_ms'])} | "
      f"{f(lambda r: r['straggler'].get('baseline_period_ms'))} -> {f(lambda r: r['straggler']['period_ms'])} | "
      f"{spread(lambda r: r['straggler'].get('hidden'))} | "
      f"{f(lambda r: r['straggler'].get('baseline_straggler_exposed_ms'))} -> "
      f"{f(lambda r: r['straggler']['straggler_exposed_ms'])} | {spread(lambda r: r['straggler'].get('hidden_in_wait'))} |")
EOF
}

failed=0
IFS=, read -ra layout_list <<<"$layouts"
IFS=, read -ra thread_counts <<<"$threads_list"
IFS=, read -ra batch_sizes <<<"$batches"
for layout in "${layout_list[@]}"; do
  hosts=${layout%x*} ranks=${layout#*x}
  for threads in "${thread_counts[@]}"; do
    for batch in "${batch_sizes[@]}"; do
      name=h${hosts}r${ranks}t${threads}b${batch}
      analyses=()
      for ((round = 1; round <= rounds; round++)); do
        if run "$name-r$round-base" "$hosts" "$ranks" "$threads" "$batch" &&
          run "$name-r$round-slow" "$hosts" "$ranks" "$threads" "$batch" --straggler "$straggler"; then
          /usr/bin/python3 tools/analyze_timeline.py --json --skip $skip --straggler "$slow_rank" \
            --baseline "$work/$name-r$round-base.{rank}.json" "$work/$name-r$round-slow.{rank}.json" \
            >"$work/$name-r$round.json"
          analyses+=("$work/$name-r$round.json")
        else
          failed=1
        fi
      done
      if ((${#analyses[@]})); then
        row "$layout" "$threads" "$batch" "${analyses[@]}"
      else
        echo "| $layout | $threads | $batch | failed | | | | | | | | | | | |"
      fi
    done
  done
done
exit $failed
