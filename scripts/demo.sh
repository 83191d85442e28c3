#!/usr/bin/env bash
# The main job: installs what it needs, builds, and runs the collectives demo.
# Arguments go to tutti-demo (e.g. -n 8 --count 65536).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/tools/tutti-demo "$@"
