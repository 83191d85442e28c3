#!/usr/bin/env bash
# Validates tutti-sim against measured training steps on the emulated cluster (docs/scaling.md).
#
# For each link rate: measures the network with `tutti-bench --calibrate` (across hosts: 2 hosts x
# 1 rank over the shaped links; inside a host: 2 ranks over shared memory) into a network file.
# Then for each layout HxR, overlap on and off, and each fusion threshold: runs tutti-train on
# scripts/cluster.sh with --profile (the run records its own model profile: its compute as it ran,
# with the job's ranks sharing this machine's cores; every rank writes its own), then simulates
# the fastest rank's profile with the others as stragglers by their measured compute, with the
# same layout, policy and network, and prints measured and simulated step times side by side.
#
# Usage: scripts/sim_validate.sh [--build DIR] [--rates "1gbit 10gbit"] [--layouts "2x1 2x2 4x1 4x2"]
#                                [--fusion "67108864 0"] [--steps N (per rank, default 30)] [--keep DIR]
# Needs root (cluster.sh); prints SKIPPED and exits 77 without it or without tutti-train.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build
rates="1gbit 10gbit"
layouts="2x1 2x2 4x1 4x2"
fusions="67108864 0"
steps=30
keep=
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --fusion) fusions=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--rates LIST] [--layouts LIST] [--fusion LIST] [--steps N] [--keep DIR]" >&2
       exit 2 ;;
  esac
done
train=$build/tools/train/tutti-train
bench=$build/tools/bench/tutti-bench
sim=$build/tools/tutti-sim
run=$build/tools/tutti-run
for bin in "$train" "$bench" "$sim" "$run"; do
  [[ -x $bin ]] || { echo "SKIPPED: $bin is not built"; exit 77; }
done
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
[[ -n $keep ]] || trap 'rm -rf "$work"' EXIT

# cost_model of a tuning file as network-file lines, with a prefix for the intra-host keys.
cost_lines() {  # cost_lines FILE PREFIX
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
models = doc.get("cost_model", {})
if len(models) != 1:
    sys.exit(f"{sys.argv[1]}: expected one cost_model entry, found {list(models)}")
m = next(iter(models.values()))
p = sys.argv[2]
print(f"{p}alpha {m['alpha_s']:.6g}\n{p}beta {m['beta_s_per_byte']:.6g}")
if p:
    print(f"gamma {m['gamma_s_per_element']:.6g}")
PY
}

TUTTI_TUNING_FILE= "$run" -n 2 -- "$bench" --calibrate --output "$work/intra.json" >"$work/intra.log" 2>&1 ||
  { cat "$work/intra.log"; exit 1; }
echo "| rate | layout | overlap | fusion | measured step ms | simulated step ms | simulated / measured | sim exposed ms | measured exposed ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for rate in $rates; do
  status=0
  bash "$here/scripts/cluster.sh" --hosts 2 --ranks 1 --rate "$rate" -- "$bench" --calibrate \
    --output "$work/inter-$rate.json" >"$work/inter-$rate.log" 2>&1 || status=$?
  ((status == 77)) && { cat "$work/inter-$rate.log"; exit 77; }
  ((status == 0)) || { cat "$work/inter-$rate.log"; exit 1; }
  net=$work/$rate.network
  { cost_lines "$work/inter-$rate.json" ""; cost_lines "$work/intra.json" "intra_"; } >"$net"
  for layout in $layouts; do
    hosts=${layout%x*} per_host=${layout#*x}
    for overlap in on off; do
      for fusion in $fusions; do
        tag=$rate-$layout-$overlap-$fusion
        # STEPS steps per rank (tutti-train leaves out the first 5 as warm-up).
        flags=(--epochs 1 --train-samples $((steps * 64 * hosts * per_host)) --test-samples 200 --batch-size 64 --threads 1
               --fusion-threshold "$fusion" --profile "$work/$tag-{rank}.profile")
        [[ $overlap == off ]] && flags+=(--no-overlap)
        bash "$here/scripts/cluster.sh" --hosts "$hosts" --ranks "$per_host" --rate "$rate" --timeout 900 -- \
          env TUTTI_TUNING_FILE= "$train" "${flags[@]}" >"$work/$tag.log" 2>&1 || { cat "$work/$tag.log"; exit 1; }
        measured=$(sed -n 's/.*tutti-train: summary step_ms=\([0-9.]*\).*/\1/p' "$work/$tag.log" | head -1)
        exposed=$(sed -n 's/^\[0\] epoch .*exposed \([0-9.]*\) ms\/step.*/\1/p' "$work/$tag.log" | tail -1)
        # Every rank's compute as it ran: the fastest rank's profile, the others as stragglers
        # by the ratio of their compute to it.
        read -r base stragglers < <(/usr/bin/python3 - "$work/$tag" $((hosts * per_host)) <<'PY'
import sys
prefix, p = sys.argv[1], int(sys.argv[2])
def compute(path):
    total = 0.0
    for line in open(path):
        f = line.split()
        if f and f[0] in ("forward", "optimizer"): total += float(f[1])
        if f and f[0] == "grad": total += float(f[4])
    return total
times = [compute(f"{prefix}-{r}.profile") for r in range(p)]
fastest = min(range(p), key=lambda r: times[r])
slow = [f"--straggler {r}:{times[r] / times[fastest]:.4f}" for r in range(p) if times[r] > times[fastest]]
print(f"{prefix}-{fastest}.profile", " ".join(slow))
PY
)
        # shellcheck disable=SC2206
        sim_flags=(--profile "$base" --network "$net" --ranks $((hosts * per_host)) --ranks-per-host "$per_host"
                   --overlap "$overlap" --fusion-threshold "$fusion" --json $stragglers)
        row=$("$sim" "${sim_flags[@]}" | tail -1)
        /usr/bin/python3 - "$row" "$measured" "$exposed" "$rate" "$layout" "$overlap" "$fusion" <<'PY'
import json, sys
row, measured, exposed = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
sim = 1e3 * row["step_s"]
print(f"| {sys.argv[4]} | {sys.argv[5]} | {sys.argv[6]} | {sys.argv[7]} | {measured:.2f} | {sim:.2f} | "
      f"{sim / measured:.2f} | {1e3 * row['exposed_s']:.2f} | {exposed} |")
PY
      done
    done
  done
done
