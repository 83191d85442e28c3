#!/usr/bin/env bash
# The sparse collectives on the emulated cluster: tutti-bench --collective sparse_allreduce (every sparse
# algorithm, automatic and the dense allreduce, each result checked) for each cluster layout and
# link rate, one run after the other. Prints each run's table under a header naming its layout.
#
#   scripts/sparse_study.sh [--layouts HxR[,HxR...]] [--rates R[,R...]] [--density D[,D...]]
#                           [--dim N] [--no-calibrate] [-- BENCH-FLAGS...]
#
# Defaults: layouts 4x1,2x2 (hosts x ranks per host), rates 1gbit,10gbit, densities
# 0.001,0.01,0.1,0.5, dim 16M (f32). BENCH-FLAGS go to tutti-bench (e.g. -n 5 -w 1, -d f64). The
# build: $TUTTI_BUILD_DIR (default build/). On a machine whose CPUs move less than a rate between
# namespaces (docs/cluster.md), that rate is no limit: say so next to its numbers.
# Each layout and rate is first measured with tutti-bench --calibrate, and `automatic` prices it
# with that cost model (TUTTI_TUNING_FILE, as a user's calibrated cluster would); --no-calibrate
# leaves the environment's TUTTI_TUNING_FILE (or the defaults) in place.
set -euo pipefail
cd "$(dirname "$0")/.."
layouts=4x1,2x2 rates=1gbit,10gbit density=0.001,0.01,0.1,0.5 dim=16M calibrate=1
usage() { sed -n '2,16s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case $1 in
    --layouts | --rates | --density | --dim)
      (($# >= 2)) || { echo "sparse_study.sh: $1 needs a value" >&2; exit 2; }
      case $1 in --layouts) layouts=$2 ;; --rates) rates=$2 ;; --density) density=$2 ;; --dim) dim=$2 ;; esac
      shift 2 ;;
    --no-calibrate) calibrate=0; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "sparse_study.sh: unknown argument '$1' (tutti-bench flags go after --)" >&2; exit 2 ;;
  esac
done
bench=${TUTTI_BUILD_DIR:-build}/tools/bench/tutti-bench
[[ -x $bench ]] || { echo "sparse_study.sh: no $bench (set TUTTI_BUILD_DIR)" >&2; exit 1; }
IFS=, read -ra layout_list <<<"$layouts"
IFS=, read -ra rate_list <<<"$rates"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for layout in "${layout_list[@]}"; do
  [[ $layout =~ ^([0-9]+)x([0-9]+)$ ]] || { echo "sparse_study.sh: layout '$layout' is not HxR" >&2; exit 2; }
  hosts=${BASH_REMATCH[1]} ranks=${BASH_REMATCH[2]}
  for rate in "${rate_list[@]}"; do
    echo "## $layout (hosts x ranks), links at $rate"
    cluster=(bash scripts/cluster.sh --hosts "$hosts" --ranks "$ranks" --rate "$rate" --timeout 1800 --)
    if ((calibrate)); then
      # Measured without any tuning file (an earlier one would be read first), then used.
      TUTTI_TUNING_FILE= "${cluster[@]}" "$bench" --calibrate --output "$work/cost-$layout-$rate.json" \
        >"$work/calibrate.log" 2>&1 || { cat "$work/calibrate.log" >&2; failed=1; continue; }
      grep 'cost model for' "$work/calibrate.log" || true
      export TUTTI_TUNING_FILE=$work/cost-$layout-$rate.json
    fi
    "${cluster[@]}" "$bench" --collective sparse_allreduce --density "$density" --dim "$dim" "$@" || failed=1
    echo
  done
done
exit $failed
