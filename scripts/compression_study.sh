#!/usr/bin/env bash
# Gradient compression on the emulated cluster: tutti-train with each compressor, and PyTorch DDP
# (tools/ddp_peer.py --from-env) with each of its hooks, one after the other on the same cluster
# shape and link rate, the same model, data and flags. Prints a Markdown table: step time, the
# exposed communication per step (tutti-train's own measure), the bytes each host's link sent per
# step, and the test accuracy after the last epoch.
#
#   scripts/compression_study.sh [--hosts H] [--ranks R] [--rate RATE] [--tutti LIST] [--ddp LIST]
#                                [-- FLAGS...]
#
# H x R ranks (default 2 x 1), RATE as scripts/cluster.sh takes it (default 100mbit: where the
# dense allreduce of this model's 0.9 MB of gradients is at least half the step). LIST: comma-
# separated compressors (defaults: none,fp16,bf16,qsgd:8,qsgd:4,powersgd:2,topk:0.01,topk:0.01:40 for
# tutti-train, none,fp16,powersgd:2 for DDP; an empty LIST skips that side). FLAGS go to both
# programs (default: --epochs 2 --train-samples 12800 --test-samples 2000 --batch-size 64
# --threads 1; a flag given replaces its default). The build: $TUTTI_BUILD_DIR (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=2 ranks=1 rate=100mbit
tutti_list=none,fp16,bf16,qsgd:8,qsgd:4,powersgd:2,topk:0.01,topk:0.01:40
ddp_list=none,fp16,powersgd:2
usage() { sed -n '2,18s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case $1 in
    --hosts | --ranks | --rate | --tutti | --ddp)
      (($# >= 2)) || { echo "compression_study.sh: $1 needs a value" >&2; exit 2; }
      case $1 in --hosts) hosts=$2 ;; --ranks) ranks=$2 ;; --rate) rate=$2 ;; --tutti) tutti_list=$2 ;; --ddp) ddp_list=$2 ;; esac
      shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "compression_study.sh: unknown argument '$1' (flags for both programs go after --)" >&2; exit 2 ;;
  esac
done
source scripts/train_flags.sh
train_flags --epochs 2 --train-samples 12800 --test-samples 2000 --batch-size 64 --threads 1 -- "$@"
build=${TUTTI_BUILD_DIR:-build}
train=$build/tools/train/tutti-train
[[ -x $train ]] || { echo "compression_study.sh: no $train (set TUTTI_BUILD_DIR)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# row PROGRAM COMPRESSION LOG: one table row from a run's output (summary, last epoch, link bytes).
row() {
  local program=$1 compression=$2 log=$3 summary epoch step acc exposed sent steps
  summary=$(grep -E '(tutti-train|ddp_peer): summary' "$log" | tail -n 1)
  epoch=$(grep -E '^\[0\] epoch ' "$log" | tail -n 1)
  step=$(sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' <<<"$summary")
  acc=$(sed -n 's/.*test_acc=\([0-9.]*\).*/\1/p' <<<"$summary")
  exposed=$(sed -n 's/.*exposed \([0-9.]*\) ms\/step.*/\1/p' <<<"$epoch")
  # Bytes host0's link sent over the whole run, per training step of the run.
  sent=$(sed -n 's/.*host0 link: sent \([0-9]*\) bytes.*/\1/p' "$log" | tail -n 1)
  steps=$(awk -v e="$epochs" -v n="$samples" -v p="$((hosts * ranks))" -v b="$batch" 'BEGIN { print e * int(n / (p * b)) }')
  awk -v pr="$program" -v c="$compression" -v s="${step:-nan}" -v x="${exposed:--}" -v by="${sent:-0}" \
    -v st="$steps" -v a="${acc:-nan}" 'BEGIN {
      printf "| %s | %s | %s | %s | %.0f | %.2f%% |\n", pr, c, s, x, (st > 0 ? by / st / 1e3 : 0), 100 * a }'
}
value_of() {  # value_of FLAG: the value FLAG has in common
  local i
  for ((i = 0; i < ${#common[@]}; i++)); do
    [[ ${common[i]} == "$1" ]] && { echo "${common[i + 1]}"; return; }
    [[ ${common[i]} == "$1="* ]] && { echo "${common[i]#*=}"; return; }
  done
}
epochs=$(value_of --epochs) samples=$(value_of --train-samples) batch=$(value_of --batch-size)
# --train-samples 0 (or none given) trains on the whole training set, Fashion-MNIST's 60,000.
[[ -z $samples || $samples == 0 ]] && samples=60000

echo "compression: $hosts host(s) x $ranks rank(s), links at $rate, flags: ${common[*]}"
echo
echo "| program | compression | step ms | exposed ms/step | KB sent per step (host0) | test accuracy |"
echo "| --- | --- | --- | --- | --- | --- |"
failed=0
run() {  # run PROGRAM COMPRESSION COMMAND...
  local program=$1 compression=$2 log
  shift 2
  log=$work/${program}-${compression//:/_}.log
  echo "running $program --compression $compression" >&2
  if bash scripts/cluster.sh --hosts "$hosts" --ranks "$ranks" --rate "$rate" --timeout 1800 -- "$@" >"$log" 2>&1; then
    row "$program" "$compression" "$log"
  else
    echo "| $program | $compression | failed | | | |"
    tail -n 15 "$log" >&2
    failed=1
  fi
}
IFS=, read -ra tutti_compressors <<<"$tutti_list"
for c in "${tutti_compressors[@]}"; do run tutti-train "$c" "$train" --compression "$c" "${common[@]}"; done
IFS=, read -ra ddp_compressors <<<"$ddp_list"
for c in "${ddp_compressors[@]}"; do
  run ddp "$c" /usr/bin/python3 tools/ddp_peer.py --from-env --compression "$c" "${common[@]}"
done
exit $failed
