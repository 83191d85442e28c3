#!/usr/bin/env bash
# DDP over the torch.distributed backend "tutti" against DDP over "gloo": tools/ddp_peer.py (the
# same model, data, schedule and script; only the process group's backend differs), p = 2 and 4,
# the two backends alternating round by round. Prints each run's step time (ms, rank 0, after
# warm-up) and, per p, the median tutti/gloo step-time ratio with its min and max; then the
# allreduce DDP issues each step alone (the model's gradients, 0.8 MB of float32, one bucket), over
# both backends in one job, alternating call by call (docs/torch-distributed.md).
#
#   scripts/ddp_backend_ratio.sh [BUILD_DIR] [ROUNDS] [TRAIN_SAMPLES]
#
# BUILD_DIR (default build) must have the targets _c10d, _tutti and tutti-run built. PYTHON
# (default /usr/bin/python3, Debian's torch 1.13) is the interpreter: a venv's, with torch 2.x and
# the package pip-installed in it (docs/python.md), measures torch 2.x; BUILD_DIR then serves only
# tutti-run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
python=${PYTHON:-/usr/bin/python3}
rounds=${2:-3}
samples=${3:-6400}
export PYTHONDONTWRITEBYTECODE=1
[[ -n ${PYTHON:-} ]] || export PYTHONPATH=$build/python  # a venv's interpreter uses its installed package
results=$(mktemp)
allreduce=$(mktemp --suffix .py)
trap 'rm -f "$results" "$allreduce"' EXIT
for p in 2 4; do
  for round in $(seq "$rounds"); do
    for backend in gloo tutti; do
      step=$("$python" "$root/tools/ddp_peer.py" -n "$p" --epochs 1 --train-samples "$samples" \
               --test-samples 1000 --backend "$backend" | sed -n 's/.*summary step_ms=\([0-9.]*\).*/\1/p')
      [[ -n $step ]] || { echo "ddp_peer.py --backend $backend -n $p gave no step time" >&2; exit 1; }
      echo "p=$p round=$round backend=$backend step_ms=$step"
      echo "$p $round $backend $step" >>"$results"
    done
  done
done
# The step's allreduce alone: one job per p with both backends' process groups over the same
# ranks, alternating tutti and gloo call by call; median of 50 calls after 10 of warm-up.
cat >"$allreduce" <<'PY'
import statistics, time
import torch, torch.distributed as dist, tutti.distributed
tutti.distributed.init_process_group()
groups = {"tutti": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
grad = torch.ones(206922)  # ddp_peer.py's parameters
times = {name: [] for name in groups}
for i in range(60):
    for name, group in groups.items():
        dist.barrier(group=groups["gloo"])
        start = time.perf_counter()
        dist.all_reduce(grad, group=group)
        if i >= 10:
            times[name].append(time.perf_counter() - start)
if dist.get_rank() == 0:
    t, g = (statistics.median(times[n]) * 1e3 for n in ("tutti", "gloo"))
    print(f"p={dist.get_world_size()}: allreduce of 0.8 MB: gloo {g:.2f} ms, tutti {t:.2f} ms, tutti/gloo {t / g:.2f}")
PY
for p in 2 4; do
  "$build/tools/tutti-run" -n "$p" --no-tag-output "$python" "$allreduce"
done
echo "torch $("$python" -c 'import torch; print(torch.__version__)')"
"$python" - "$results" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
for p in sorted({int(r[0]) for r in rows}):
    step = {(r[1], r[2]): float(r[3]) for r in rows if int(r[0]) == p}
    rounds = sorted({r for r, _ in step})
    ratios = [step[(r, "tutti")] / step[(r, "gloo")] for r in rounds]
    med = lambda b: statistics.median(step[(r, b)] for r in rounds)
    print(f"p={p}: step gloo {med('gloo'):.1f} ms, tutti {med('tutti'):.1f} ms (medians of {len(rounds)} rounds); "
          f"tutti/gloo {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
PY
