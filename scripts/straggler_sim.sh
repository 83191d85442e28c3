#!/usr/bin/env bash
# Li et al.'s questions (SC19) asked of the simulator at scale: how much of a straggler's delay
# does the engine's pipelining hide, and how large are the gaps between weight updates? Simulates
# a profile (default profiles/resnet50.profile) on RANKS ranks (default 1024, 4 per host) without
# a straggler and with rank 5 slowed by each FACTOR, writes the simulated timelines, and reads them
# with tools/analyze_timeline.py like a real run's.
# Usage: scripts/straggler_sim.sh [--sim BIN] [--profile FILE] [--network FILE] [--ranks N]
#                                 [--per-host R] [--factors "1.1 1.25 1.5 2"] [--keep DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
sim=$here/build/tools/tutti-sim
profile=$here/profiles/resnet50.profile
network=
ranks=1024
per_host=4
factors="1.1 1.25 1.5 2"
keep=
while (($#)); do
  case $1 in
    --sim) sim=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --network) network=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --factors) factors=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "usage: $0 [--sim BIN] [--profile FILE] [--network FILE] [--ranks N] [--per-host R] [--factors LIST] [--keep DIR]" >&2
       exit 2 ;;
  esac
done
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
[[ -n $keep ]] || trap 'rm -rf "$work"' EXIT
common=(--profile "$profile" --ranks "$ranks" --ranks-per-host "$per_host" --steps 6 --json)
[[ -n $network ]] && common+=(--network "$network")
analyze=(/usr/bin/python3 "$here/tools/analyze_timeline.py" --skip 1 --json)

"$sim" "${common[@]}" --timeline "$work/base-{rank}.json" >"$work/base.json"
echo "| straggler factor | step ms | slowest compute ms | straggler's extra compute ms | step grew by ms | hidden share of the delay | others wait in step() ms | negotiation ms | longest communication-free window ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for factor in 1 $factors; do
  if [[ $factor == 1 ]]; then
    row=$work/base.json trace="$work/base-{rank}.json"
  else
    row=$work/s$factor.json trace="$work/s$factor-{rank}.json"
    "$sim" "${common[@]}" --straggler "5:$factor" --timeline "$trace" >"$row"
  fi
  "${analyze[@]}" "${trace/\{rank\}/0}" >"$work/analysis-$factor.json"
  /usr/bin/python3 - "$work/base.json" "$row" "$work/analysis-$factor.json" "$factor" <<'PY'
import json, statistics, sys
base = json.loads(open(sys.argv[1]).read().splitlines()[-1])
row = json.loads(open(sys.argv[2]).read().splitlines()[-1])
analysis = json.load(open(sys.argv[3]))
factor = float(sys.argv[4])
extra = row["compute_s"] - base["compute_s"]
grew = row["step_s"] - base["step_s"]
hidden = f"{1 - grew / extra:.2f}" if extra > 0 else "-"
steps = analysis["ranks"]["0"]["steps"]
longest = statistics.median(s["longest_free_ms"] for s in steps)
print(f"| {factor:g} | {1e3 * row['step_s']:.1f} | {1e3 * row['compute_s']:.1f} | {1e3 * extra:.1f} | {1e3 * grew:.1f} | "
      f"{hidden} | {1e3 * row['wait_s']:.1f} | {1e3 * row['negotiation_s']:.1f} | {longest:.1f} |")
PY
done
