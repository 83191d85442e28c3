#!/usr/bin/env bash
# The main job: installs what it needs, builds, and trains the Fashion-MNIST CNN data-parallel on
# 2 processes over shared memory: tutti-run -n 2 tutti-train --epochs 2. Arguments go to
# tutti-train (e.g. --epochs 1 --no-overlap --timeline timeline.json; --help lists them);
# TUTTI_TRAIN_RANKS changes the number of processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
if [[ ! -x build/tools/train/tutti-train ]]; then
  echo "scripts/train.sh: build/tools/train/tutti-train was not built (libtorch-dev not found by CMake?)" >&2
  exit 1
fi
if (($# == 0)); then set -- --epochs 2; fi
exec ./build/tools/tutti-run -n "${TUTTI_TRAIN_RANKS:-2}" ./build/tools/train/tutti-train "$@"
