#!/usr/bin/env bash
# The Python binding's overhead (docs/python.md): an 8-byte allreduce (2 x f32, sum, out of place)
# at p = 2 under tutti-run, from C++ (tutti-bench) and from Python (tutti.Communicator.allreduce on
# NumPy arrays, or the standard library's array.array where NumPy is missing), alternating round by round in one command.
#
# usage: scripts/python_overhead.sh [BUILD_DIR] [ROUNDS] [BLOCKS] [ITERS]   (defaults: build 5 50 200)
# Needs the targets tutti-run, tutti-bench and _tutti built in BUILD_DIR.
#
# Each side times BLOCKS blocks of ITERS back-to-back calls (after warm-up) and takes the mean of
# each block, as tutti-bench does for one row (tutti-bench --collective allreduce,allreduce,... prints one
# row per block). A round reports the median and the minimum of its block means: on a loaded
# machine a rank that spins is preempted now and then, which moves the median of a round but
# rarely its minimum (the cost of a call when both ranks run). Then, over rounds, the median with
# min and max of each figure.
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
import tutti
blocks, iters = int(sys.argv[1]), int(sys.argv[2])
world = tutti.init()
try:
    import numpy as np
    send, recv = np.ones(2, np.float32), np.zeros(2, np.float32)
except ImportError:  # the standard library's arrays have the buffer protocol too
    import array
    send, recv = array.array("f", [1, 1]), array.array("f", [0, 0])
means = []
for block in range(blocks + 1):  # block 0 warms up
    world.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        world.allreduce(send, recv)
    means.append((time.perf_counter() - start) / iters * 1e6)
if list(recv) != [2.0, 2.0]:
    sys.exit(f"wrong result {recv.tolist()}")
if world.rank == 0:
    print("\n".join(f"{m:.3f}" for m in means[1:]))
PY

# "median minimum" of the block means read from stdin, one per line.
stats() { sort -g | awk '{ v[NR] = $1 } END { print ((NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1] }'; }
collectives=$(printf 'allreduce%.0s,' $(seq "$blocks")); collectives=${collectives%,}

echo "# 8-byte allreduce (2 x f32 sum, out of place), p = 2 under tutti-run: $blocks blocks of $iters calls per side and round"
echo "# per round, the median and the minimum of the block means (us)"
echo "# round  C++ median  Python median  C++ min  Python min  Python-C++ (medians)  Python-C++ (mins)"
for round in $(seq "$rounds"); do
  cpp=$("$run" -n 2 "$bench" --collective "$collectives" -b 8 -e 8 -n "$iters" -w 200 -c 0 --no-progress |
        awk '$1 == "[0]" && $2 == "8" { print $7 }' | stats)
  py=$("$run" -n 2 "$python" -c "$python_loop" "$blocks" "$iters" | awk '$1 == "[0]" { print $2 }' | stats)
  echo "$round $cpp $py"
done | "$python" -c '
import statistics, sys
rows = [tuple(map(float, line.split()[1:])) for line in sys.stdin if line.strip()]  # c_med c_min p_med p_min
for i, (cm, cn, pm, pn) in enumerate(rows, 1):
    print(f"{i:7d} {cm:11.3f} {pm:14.3f} {cn:8.3f} {pn:11.3f} {pm - cm:21.3f} {pn - cn:18.3f}")
def summary(values):
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"
print("# over rounds, median (min, max) of the rounds figures:")
print("#   medians: C++", summary([r[0] for r in rows]), "us; Python", summary([r[2] for r in rows]), "us;",
      "Python - C++", summary([r[2] - r[0] for r in rows]), "us")
print("#   minimums: C++", summary([r[1] for r in rows]), "us; Python", summary([r[3] for r in rows]), "us;",
      "Python - C++", summary([r[3] - r[1] for r in rows]), "us")
'
