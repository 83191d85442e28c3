#!/usr/bin/env bash
# Before and after a change that must not change speed: tutti-bench of two builds, alternating
# (A B A B ...: pairing keeps drift out of the ratio), p = 2 under tutti-run, no tuning file, the
# automatic choice, allreduce, reduce_scatter, allgather, broadcast and alltoall from 8 B to
# 16 MiB. Prints a Markdown table: each side's median time with its range over the rounds, and
# after / before.
#   scripts/bench_ab.sh BEFORE_BUILD AFTER_BUILD [ROUNDS (default 9)]
# A build is a build directory with tools/bench/tutti-bench (configure an older commit with
# `git worktree add /tmp/before COMMIT` and build the target tutti-bench there).
set -euo pipefail
before=$1 after=$2 rounds=${3:-9}
root=$(cd "$(dirname "$0")/.." && pwd)
run=$root/build/tools/tutti-run
out=$(mktemp -d /tmp/tutti-bench-ab.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo '{"version": 1, "entries": []}' >"$out/empty-tuning.json"
export TUTTI_TUNING_FILE=$out/empty-tuning.json
for ((round = 1; round <= rounds; round++)); do
  for side in before after; do
    build=$before
    [[ $side == after ]] && build=$after
    timeout 300 "$run" -n 2 "$build/tools/bench/tutti-bench" --no-progress -c 0 -b 8 -e 16M -f 8 \
      --collective allreduce,reduce_scatter,allgather,broadcast,alltoall --json "$out/$side-$round.json" >/dev/null
  done
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
from collections import defaultdict
times = {"before": defaultdict(list), "after": defaultdict(list)}
for side in times:
    for path in glob.glob(f"{sys.argv[1]}/{side}-*.json"):
        for row in json.load(open(path))["results"]:
            if row["algorithm"] == "automatic" and (not row["in_place"] or row["collective"] == "broadcast"):
                times[side][(row["collective"], row["bytes"])].append(row["time_us"])
print("| collective | bytes | before µs (range) | after µs (range) | after / before |")
print("| --- | ---: | --- | --- | ---: |")
for key in sorted(times["after"]):
    if key not in times["before"]:
        continue
    b, a = times["before"][key], times["after"][key]
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"| {key[0]} | {key[1]} | {mb:.2f} ({min(b):.2f}–{max(b):.2f}) | {ma:.2f} ({min(a):.2f}–{max(a):.2f}) | {ma / mb:.2f} |")
PY
