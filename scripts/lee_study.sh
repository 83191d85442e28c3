#!/usr/bin/env bash
# The question of Lee et al. (SC18): does overlapping gradient averaging with backward beat an
# allreduce after backward at scale? Simulates VGG-16 and ResNet-50 (profiles/) on Cray XC40's
# Aries network (profiles/aries.network), one rank per node, p = 64 ... 8192, for
#   (a) allreduce after backward, no fusion; (b) Tutti's overlapped engine, no fusion;
#   (c) overlapped with fusion (64 MiB, first bucket 1 MiB),
# in weak scaling (the profile's batch on every rank) and strong scaling (a global batch of
# GLOBAL samples, default 8192), and plots the speedups (docs/lee-speedup.png).
# Usage: scripts/lee_study.sh [--sim BIN] [--global N] [--out DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
sim=$here/build/tools/tutti-sim
global=8192
out=$here/docs
while (($#)); do
  case $1 in
    --sim) sim=$2; shift 2 ;;
    --global) global=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--sim BIN] [--global N] [--out DIR]" >&2; exit 2 ;;
  esac
done
ranks=64,128,256,512,1024,2048,4096,8192
mkdir -p "$out"
results=$out/lee-study.jsonl
: >"$results"
for model in vgg16 resnet50; do
  for scaling in weak strong; do
    extra=()
    [[ $scaling == strong ]] && extra=(--global-batch "$global")
    "$sim" --profile "$here/profiles/$model.profile" --network "$here/profiles/aries.network" --ranks "$ranks" \
      --compare --json "${extra[@]}" | sed "s/^{/{\"model\": \"$model\", \"scaling\": \"$scaling\", /" >>"$results"
  done
done
/usr/bin/python3 "$here/tools/plot_scaling.py" "$results" "$out/lee-speedup.png" --global "$global"
