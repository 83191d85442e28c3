#!/usr/bin/env bash
# The Python binding's overhead (docs/python.md): an 8-byte allreduce (2 x f32, sum, out of place)
# at p = 2 under tutti-run, from C++ (tutti-bench) and from Python (tutti.Communicator.allreduce on
# NumPy arrays), alternating round by round in one command.
#
# usage: scripts/python_overhead.sh [BUILD_DIR] [ROUNDS] [BLOCKS] [ITERS]   (defaults: build 5 50 200)
# Needs the targets tutti-run, tutti-bench and _tutti built in BUILD_DIR.
#
# Each side times BLOCKS blocks of ITERS back-to-back calls (after warm-up) and takes the mean of
# each block, as tutti-bench does for one row (tutti-bench -t allreduce,allreduce,... prints one
# row per block); a round's figure is the median of its block means, which a shared machine's
# preemptions do not move. Reported: every round, then the median over rounds with min and max.
set -euo pipefail
build=${1:-build}
rounds=${2:-5}
blocks=${3:-50}
iters=${4:-200}
run="$build/tools/tutti-run"
bench="$build/tools/bench/tutti-bench"
python=${PYTHON:-/usr/bin/python3}
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"

# Rank 0 prints the mean of each block, in microseconds, one per line.
read -r -d '' python_loop <<'PY' || true
import sys, time
import numpy as np
import tutti
blocks, iters = int(sys.argv[1]), int(sys.argv[2])
world = tutti.init()
send, recv = np.ones(2, np.float32), np.zeros(2, np.float32)
means = []
for block in range(blocks + 1):  # block 0 warms up
    world.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        world.allreduce(send, recv)
    means.append((time.perf_counter() - start) / iters * 1e6)
if recv.tolist() != [2.0, 2.0]:
    sys.exit(f"wrong result {recv.tolist()}")
if world.rank == 0:
    print("\n".join(f"{m:.3f}" for m in means[1:]))
PY

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
collectives=$(printf 'allreduce%.0s,' $(seq "$blocks")); collectives=${collectives%,}

echo "# 8-byte allreduce (2 x f32 sum, out of place), p = 2 under tutti-run: median of $blocks block means of $iters calls"
echo "# round  C++(us)  Python(us)  Python/C++  Python-C++(us)"
for round in $(seq "$rounds"); do
  cpp=$("$run" -n 2 "$bench" -t "$collectives" -b 8 -e 8 -n "$iters" -w 200 -c 0 --no-progress |
        awk '$1 == "[0]" && $2 == "8" { print $7 }' | median)
  py=$("$run" -n 2 "$python" -c "$python_loop" "$blocks" "$iters" | awk '$1 == "[0]" { print $2 }' | median)
  echo "$round $cpp $py"
done | "$python" -c '
import statistics, sys
rows = [tuple(map(float, line.split()[1:])) for line in sys.stdin if line.strip()]
for i, (c, p) in enumerate(rows, 1):
    print(f"{i:7d} {c:8.3f} {p:11.3f} {p / c:11.2f} {p - c:15.3f}")
def summary(values):
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"
print("# median over rounds: C++", summary([c for c, _ in rows]), "us; Python", summary([p for _, p in rows]), "us")
print("# Python / C++:", summary([p / c for c, p in rows]), "; Python - C++:", summary([p - c for c, p in rows]), "us")
'
