#!/usr/bin/env bash
# tutti-train --elastic's accuracy after a lost rank and a joiner, beside an uninterrupted run of
# the same job (docs/elastic.md): 4 ranks for EPOCHS epochs of Fashion-MNIST; in the second run,
# rank 2 is killed (SIGKILL) at step KILL_AT and, once the 3 survivors go on, SIGUSR1 to tutti-run
# starts a rank that joins at the next commit. Prints both runs' test accuracy, their difference
# in points, and the elastic generation lines (what was rolled back, and the time lost).
#
#   scripts/elastic_accuracy.sh [EPOCHS [KILL_AT [BUILD_DIR [EXTRA tutti-train FLAGS...]]]]
set -uo pipefail
epochs=${1:-3}
kill_at=${2:-300}
build=${3:-$(cd "$(dirname "$0")/.." && pwd)/build}
shift $(($# < 3 ? $# : 3))
run=$build/tools/tutti-run
train=$build/tools/train/tutti-train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(--elastic --epochs "$epochs" --commit-every 20 --log-interval 1 --threads 1 --no-progress "$@")

await() {
  for _ in $(seq 6000); do grep -qE "$1" "$tmp/$2" && return 0; sleep 0.1; done
  echo "FAILED: no line matching '$1' in 10 minutes" >&2
  exit 1
}

echo "uninterrupted: tutti-run -n 4 --elastic tutti-train ${flags[*]}"
timeout 3600 "$run" -n 4 --elastic "$train" "${flags[@]}" >"$tmp/plain" 2>&1 || { cat "$tmp/plain"; exit 1; }
plain=$(sed -n 's/.*summary .*test_acc=\([0-9.]*\).*/\1/p' "$tmp/plain")

echo "elastic: the same, rank 2 killed at step $kill_at, then a rank joins"
timeout 3600 "$run" -n 4 --elastic "$train" "${flags[@]}" >"$tmp/elastic" 2>&1 &
job=$!
await "^\[0\] tutti-train: step $kill_at " elastic
id=$(sed -n 's|.*/tutti-\([0-9a-f]\{16\}\)/join.env.*|\1|p' "$tmp/elastic")
for p in $(pgrep -x tutti-train); do
  if tr '\0' '\n' <"/proc/$p/environ" | grep -qx TUTTI_RANK=2 && tr '\0' '\n' <"/proc/$p/environ" | grep -qx "TUTTI_JOB_ID=$id"; then
    kill -KILL "$p"
  fi
done
await '^\[0\] tutti-train: elastic generation 1:' elastic
kill -USR1 "$(pgrep -P $job -x tutti-run)"
wait $job || { cat "$tmp/elastic"; exit 1; }
elastic=$(sed -n 's/.*summary .*test_acc=\([0-9.]*\).*/\1/p' "$tmp/elastic")
grep -h 'elastic generation\|parameters identical' "$tmp/elastic"
awk -v a="$plain" -v b="$elastic" 'BEGIN { printf "test accuracy: uninterrupted %.2f%%, elastic %.2f%%, difference %+.2f points\n", 100 * a, 100 * b, 100 * (b - a) }'
