#!/usr/bin/env bash
# The long soak: 10^6 mixed small collectives and 10^4 large ones (1-8 MiB) at p = 4 over shm and
# over tcp, every result checked, the resident set of every rank flat after warm-up, then kill
# runs (one rank killed with SIGKILL at a random moment) on each transport. Prints the figures:
# calls/s, RSS at start, after warm-up and at the end, errors, time to detect a kill.
#   scripts/soak.sh [SMALL [LARGE [KILLS]]]      (default 1000000 10000 3)
# tests/comm/soak_test.sh is the same test, shorter (ctest runs it as `soak`); its environment
# variables (SOAK_SEED, SOAK_TRANSPORTS, SOAK_RSS_BOUND_MIB...) work here too.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/build.ninja ]] || bash scripts/build.sh >/dev/null
cmake --build build --target tutti-run soak_program >/dev/null
export SOAK_SMALL=${1:-1000000} SOAK_LARGE=${2:-10000} SOAK_KILLS=${3:-3}
export SOAK_RUN_LIMIT_S=${SOAK_RUN_LIMIT_S:-7200} SOAK_REPORTS=${SOAK_REPORTS:-20}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
bash tests/comm/soak_test.sh build/tools/tutti-run build/tests/soak_program | tee "$log" || status=$?
echo "== figures"
grep '^figure' "$log" | sed 's/^figure //'
grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log"
exit $status
