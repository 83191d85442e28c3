#!/usr/bin/env bash
# The main job: installs what it needs, builds, and runs the collectives demo on 4 processes over
# shared memory (tutti-run). Arguments go to tutti-demo (e.g. --count 65536 --iters 10).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/tools/tutti-run -n "${TUTTI_DEMO_RANKS:-4}" ./build/tools/tutti-demo "$@"
