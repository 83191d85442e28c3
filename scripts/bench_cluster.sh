#!/usr/bin/env bash
# The emulated cluster's table (docs/performance.md, "Across hosts"): Tutti beside Open MPI and
# Gloo in one job on the same links. For each layout (2 hosts x 2 ranks, 4 hosts x 1) and link
# rate (1gbit, 10gbit), RUNS runs (default 2) of
#   scripts/cluster.sh --mpirun --hosts H --ranks R --rate RATE -- tutti-bench --collective
#     allreduce,allgather,reduce_scatter,alltoall,broadcast -b 8 -e 16M -f 8 -w 2 --peers mpi,gloo
# (tutti-bench's own count of timed calls: about 50 ms a cell, at least 5; with 5 calls a cell,
# as before 2026-12-07, a small cell swung by 2x from run to run)
# (mpirun in host 0's namespace starts every rank; Tutti bootstraps through MPI and takes shared
# memory within a host and TCP across, MPI vader and tcp, Gloo TCP), into DIR (default
# bench-results/): cluster-HxR-RATE-RUN.json and .log, and per layout and rate one table per peer,
# a row per collective, a column per size, the peer's time / Tutti's, median (min-max) of the runs
# (cluster-HxR-RATE.md, cluster-HxR-RATE-gloo.md), and a plot per collective of bus bandwidth and
# Tutti / peer by size (cluster-HxR-RATE-COLLECTIVE.png). Also one run with unlimited links (the
# machine's own ceiling for TCP between namespaces: a rate above it is not emulated).
#   scripts/bench_cluster.sh [DIR] [RUNS]
# Needs root, iproute2 and Open MPI (exits 77 with SKIPPED otherwise, as cluster.sh does).
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-bench-results}")
runs=${2:-2}
mkdir -p "$out"
bench=$PWD/build/tools/bench/tutti-bench
[[ -x $bench ]] || bash scripts/build.sh >/dev/null
# Automatic with no tuning file: what a new user gets.
echo '{"version": 1, "entries": []}' >"$out/empty-tuning.json"
export TUTTI_TUNING_FILE=$out/empty-tuning.json

one() {  # HOSTS RANKS RATE NAME
  local log=$out/$4.log
  bash scripts/cluster.sh --mpirun --hosts "$1" --ranks "$2" --rate "$3" --timeout 900 -- "$bench" --no-progress \
    --collective allreduce,allgather,reduce_scatter,alltoall,broadcast -b 8 -e 16M -f 8 -w 2 -c 0 \
    --peers mpi,gloo --json "$out/$4.json" >"$log" 2>&1
  local status=$?
  if ((status == 77)); then
    grep SKIPPED "$log"
    exit 77
  fi
  ((status == 0)) || { echo "bench_cluster.sh: $4 failed (status $status), see $log" >&2; exit 1; }
  grep '^cluster.sh: host0 link' "$log"
}

for layout in 2x2 4x1; do
  hosts=${layout%x*} ranks=${layout#*x}
  for rate in 1gbit 10gbit; do
    for ((run = 1; run <= runs; run++)); do one "$hosts" "$ranks" "$rate" "cluster-$layout-$rate-$run"; done
    /usr/bin/python3 tools/bench_table.py matrix mpi "$out"/cluster-$layout-$rate-?.json >"$out/cluster-$layout-$rate.md"
    /usr/bin/python3 tools/bench_table.py matrix gloo "$out"/cluster-$layout-$rate-?.json \
      >"$out/cluster-$layout-$rate-gloo.md"
    for collective in allreduce allgather reduce_scatter alltoall broadcast; do  # a plot per collective
      /usr/bin/python3 tools/plot_bench.py --ratio --collective "$collective" $([[ $collective == broadcast ]] && echo --in-place) \
        --out "$out/cluster-$layout-$rate-$collective.png" "$out"/cluster-$layout-$rate-?.json >/dev/null
    done
  done
  one "$hosts" "$ranks" unlimited "cluster-$layout-unlimited"
done
echo "results in $out/cluster-*.md"
