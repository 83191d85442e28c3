#!/usr/bin/env bash
# Configures and builds Tutti into build/ (Release with debug info, warnings as errors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTUTTI_WERROR=ON >/dev/null
cmake --build build -j "$(nproc)"
