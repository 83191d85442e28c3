#!/usr/bin/env bash
# tutti-train beside PyTorch DDP over Gloo (tools/ddp_peer.py) on this machine, the same model and
# flags, alternating: for each round, tutti-train under tutti-run, then ddp_peer.py. Prints a table
# of the step times (tools/compare_ddp.py) and a last line
#   compare: tutti step X ms, ddp step Y ms, ratio Z (median of R rounds; target <= 0.8), tutti hidden H%, overlapped O%
#   scripts/compare_ddp.sh [-n P] [--rounds R] [-- FLAGS...]
# P ranks (default 2), R rounds (default 3). Common flags, passed to both: --epochs 1
# --train-samples 12800 --test-samples 1000 --batch-size 64 --threads 1; FLAGS after -- go to both
# too and replace a default of the same name. The build: $TUTTI_BUILD_DIR (default build/; build/ is
# built with scripts/build.sh when it has no tutti-train).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }
ranks=2 rounds=3
while (($#)); do
  case $1 in
    -n | --rounds)
      (($# >= 2)) || { echo "compare_ddp.sh: $1 needs a value" >&2; exit 2; }
      if [[ $1 == -n ]]; then ranks=$2; else rounds=$2; fi
      shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "compare_ddp.sh: unknown argument '$1' (flags for both runs go after --)" >&2; usage >&2; exit 2 ;;
  esac
done
for v in "$ranks" "$rounds"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "compare_ddp.sh: '$v' is not a positive integer" >&2; exit 2; }
done

source scripts/train_flags.sh
train_flags --epochs 1 --train-samples 12800 --test-samples 1000 --batch-size 64 --threads 1 -- "$@"

build=${TUTTI_BUILD_DIR:-build}
train=$build/tools/train/tutti-train
if [[ ! -x $train && $build == build ]]; then
  echo "compare_ddp.sh: no $train; building with scripts/build.sh" >&2
  bash scripts/build.sh >/dev/null
fi
for f in "$train" "$build/tools/tutti-run"; do
  [[ -x $f ]] || { echo "compare_ddp.sh: no $f (set TUTTI_BUILD_DIR to the build folder)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # run LOG COMMAND...: the whole output to LOG; on failure shows its end and stops
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "compare_ddp.sh: failed: $*" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}
echo "compare: p=$ranks, $rounds round(s), flags: ${common[*]}"
for ((r = 1; r <= rounds; r++)); do
  echo "round $r/$rounds: tutti-train" >&2
  run "$work/tutti-$r.log" "$build/tools/tutti-run" -n "$ranks" "$train" "${common[@]}"
  echo "round $r/$rounds: ddp_peer" >&2
  run "$work/ddp-$r.log" /usr/bin/python3 tools/ddp_peer.py -n "$ranks" "${common[@]}"
done
/usr/bin/python3 tools/compare_ddp.py --rounds "$rounds" "$work"
