#!/usr/bin/env bash
# Model parallelism and sharding measured on this machine, one run each: step time, memory per
# rank and test accuracy of tutti-train at one global batch for data parallelism (p = 4), pipeline
# 2 x data 2 (GPipe and 1F1B, M = 4 and 8), tensor 2 x data 2, ZeRO-1 and ZeRO-2 (p = 4), and one
# rank out of core under two device-memory budgets against the same rank unbounded; and the
# pipeline's idle share per stage against (N-1)/(M+N-1) and against the prediction from the
# stages' own compute times (unequal stages: step = sum of t_s + (M-1) max t_s, stage s idle
# 1 - M t_s / step, t_s its compute per micro-batch).
#
#   scripts/parallel_study.sh [--epochs E] [--global-batch G] [--out FILE]
#
# Defaults: E = 2, G = 256, the markdown tables to stdout (and FILE). The build: $TUTTI_BUILD_DIR
# (default build/). On the 2-core machine four ranks share two cores: see docs/parallelism.md.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=2 global=256 out=
while (($#)); do
  case $1 in
    --epochs) epochs=$2; shift 2 ;;
    --global-batch) global=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,15s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "parallel_study.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
build=${TUTTI_BUILD_DIR:-build}
train=$build/tools/train/tutti-train
run=$build/tools/tutti-run
for tool in "$train" "$run"; do [[ -x $tool ]] || { echo "parallel_study.sh: no $tool (set TUTTI_BUILD_DIR)" >&2; exit 1; }; done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
report=$work/report.md

# measure NAME RANKS FLAGS...: one run; a row of the main table, and the pipeline's stage lines.
measure() {
  local name=$1 ranks=$2
  shift 2
  if ! timeout -s KILL 1800 "$run" -n "$ranks" "$train" --epochs "$epochs" "$@" >"$work/out" 2>&1; then
    echo "| $name | failed: $(tail -1 "$work/out") |" >>"$report"
    return
  fi
  awk -v name="$name" '
    /tutti-train: summary/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
    /tutti-train: rank [0-9]+ params_mb=/ {
      for (i = 1; i <= NF; i++) { split($i, kv, "="); if (!(kv[1] in max) || kv[2] + 0 > max[kv[1]]) max[kv[1]] = kv[2] + 0 } }
    / device memory / { for (i = 1; i <= NF; i++) { split($i, kv, "="); d[kv[1]] = kv[2] } }
    END {
      mem = ("params_mb" in max) ? sprintf("%.3f | %.3f | %.3f | %.0f", max["params_mb"], max["optimizer_state_mb"],
                                           max["gradients_mb"], max["max_rss_mb"]) : "- | - | - | -"
      dev = ("peak" in d) ? sprintf("%s / %s MiB, swapped %s MiB out", d["peak"], d["budget"], d["swapped_out"]) : ""
      printf "| %s | %s | %s | %.2f%% | %s | %s | %s |\n", name, v["step_ms"], v["samples_per_s"], 100 * v["test_acc"],
             v["loss"], mem, dev }' "$work/out" >>"$report"
  if grep -q 'idle=' "$work/out"; then
    local m
    m=$(sed -n 's/.*micro-batches=\([0-9]*\).*/\1/p' "$work/out" | head -1)
    awk -v name="$name" -v m="$m" '
      /params_mb=.*idle=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["compute_ms"] > 0) { s = n++; t[s] = v["compute_ms"] / m; idle[s] = v["idle"]; pipe[s] = v["pipeline_step_ms"] } }
      END {
        # The ranks are (d, stage) with stage the fastest-varying: stage = index mod N, N from the names.
        split(name, parts, "pipeline"); N = substr(parts[2], 1, 1) + 0
        for (s = 0; s < N; s++) { k = 0; for (i = s; i < n; i += N) { tt[s] += t[i]; id[s] += idle[i]; k++ } tt[s] /= k; id[s] /= k }
        total = 0; top = 0; for (s = 0; s < N; s++) { total += tt[s]; if (tt[s] > top) top = tt[s] }
        step = total + (m - 1) * top
        for (s = 0; s < N; s++)
          printf "| %s | %d | %.2f | %.3f | %.3f | %.3f |\n", name, s, tt[s] * m, id[s], 1 - m * tt[s] / step, (N - 1) / (m + N - 1)
      }' "$work/out" >>"$work/bubble.md"
  fi
  echo "done: $name" >&2
}

{
  echo "Global batch $global, $epochs epochs, lr 0.05, one run each ($(date -u +%Y-%m-%d), $(nproc) cores)."
  echo
  echo "| layout | step ms | samples/s | test acc | loss | params MB/rank | optimizer state MB/rank | gradients MB/rank | peak RSS MB | device memory |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
} >"$report"
: >"$work/bubble.md"
measure "data 4" 4 --batch-size $((global / 4))
for schedule in gpipe 1f1b; do
  for m in 4 8; do
    measure "pipeline2 x data 2, $schedule M=$m" 4 --batch-size $((global / 2)) --pipeline 2 --micro-batches $m --schedule $schedule
  done
done
measure "tensor 2 x data 2" 4 --batch-size $((global / 2)) --tensor-parallel 2
measure "ZeRO-1, data 4" 4 --batch-size $((global / 4)) --zero 1
measure "ZeRO-2, data 4" 4 --batch-size $((global / 4)) --zero 2
for mb in 1000000 16 12; do
  measure "1 rank, device memory $mb MiB" 1 --batch-size $global --device-memory $mb
done
{
  echo
  echo "| layout | stage | compute ms/step | idle measured | idle predicted (its stages) | (N-1)/(M+N-1) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  cat "$work/bubble.md"
} >>"$report"
cat "$report"
[[ -z $out ]] || cp "$report" "$out"
