#!/usr/bin/env bash
# Reproduces docs/performance.md's measurements on this machine, into DIR (default bench-results/):
#   1. tutti-bench --tune for 2 ranks (the tuning file the later runs use; kept if DIR has one);
#   2. p = 2 under mpirun: allreduce, reduce_scatter, allgather, broadcast from 4 B to 256 MiB with
#      the MPI and Gloo peers and the ceiling, in one job (peers.json);
#   3. p = 2, allreduce with every algorithm and the tuning file (automatic.json); then the four
#      collectives from 64 KiB to 16 MiB with every algorithm and no tuning file (what a new user
#      gets), five passes one after the other: automatic's median beside the fastest forced
#      algorithm's, with the spread over passes (automatic-model-*.json, automatic-model.md);
#   4. p = 4 and 8 on the same cores, allreduce beside MPI (p4.json, p8.json);
#   5. p = 2, allreduce on buffers from Communicator::allocate (zero copy) beside MPI on the same
#      buffers, with the ceiling (shared.json);
#   6. every collective at p = 2 and p = 4 under plain mpirun, no tuning file, from 8 B to 16 MiB,
#      beside MPI and Gloo, three runs each (every-p2-*.json, every-p4-*.json), and one table per
#      p: a row per collective, a column per size, MPI time / Tutti time, median (min-max) of the
#      runs (every-p2.md, every-p4.md, every-gloo-p2.md; the in-place forms beside MPI_IN_PLACE in
#      every-pP-in-place.md), and a plot per collective and p of bus
#      bandwidth and Tutti / peer by size (every-pP-COLLECTIVE.png);
#   7. the tables (bench_table.py) and the plot (plot_bench.py);
#   8. across hosts on the emulated cluster, beside MPI and Gloo on the same links
#      (scripts/bench_cluster.sh DIR: cluster-*.md), where namespaces can be made (root).
#   scripts/bench.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}
mkdir -p "$out"
bash scripts/build.sh >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bench=build/tools/bench/tutti-bench
tuning="$out/tuning.json"
empty="$out/empty-tuning.json"
echo '{"version": 1, "entries": []}' >"$empty"

mpi() {  # mpi RANKS TUNING_FILE ARGS...
  local ranks=$1 file=$2
  shift 2
  TUTTI_TUNING_FILE=$file mpirun --oversubscribe -np "$ranks" -x TUTTI_TUNING_FILE "$bench" --no-progress "$@"
}

[[ -s $tuning ]] || build/tools/tutti-run -n 2 "$bench" --no-progress --tune -b 4 -e 64M -f 4 --output "$tuning" | tee "$out/tune.log"
mpi 2 "$tuning" --collective allreduce,reduce_scatter,allgather,broadcast -b 4 -e 256M -f 4 --peers mpi,gloo --ceiling \
  --json "$out/peers.json" | tee "$out/peers.log"
mpi 2 "$tuning" --collective allreduce -b 4 -e 256M -f 4 --all-algorithms --json "$out/automatic.json" >"$out/automatic.log"
for pass in 1 2 3 4 5; do
  mpi 2 "$empty" --collective allreduce,reduce_scatter,allgather,broadcast -b 64K -e 16M -f 2 -c 0 --all-algorithms \
    --json "$out/automatic-model-$pass.json" >"$out/automatic-model-$pass.log"
done
for p in 4 8; do
  mpi "$p" "$empty" --collective allreduce -b 4 -e 64M -f 4 --peers mpi --json "$out/p$p.json" | tee "$out/p$p.log"
done
mpi 2 "$tuning" --collective allreduce -b 16K -e 256M -f 4 --peers mpi --ceiling --shared-buffers --json "$out/shared.json" |
  tee "$out/shared.log"
for p in 2 4; do
  for run in 1 2 3; do
    mpi "$p" "$empty" --collective all -b 8 -e 16M -f 8 --peers mpi,gloo -c 0 --json "$out/every-p$p-$run.json" \
      >"$out/every-p$p-$run.log"
  done
  /usr/bin/python3 tools/bench_table.py matrix mpi "$out"/every-p$p-?.json >"$out/every-p$p.md"
  /usr/bin/python3 tools/bench_table.py matrix-in-place mpi "$out"/every-p$p-?.json >"$out/every-p$p-in-place.md"
  for collective in allreduce reduce_scatter allgather allgatherv broadcast reduce alltoall alltoallv gather scatter; do
    /usr/bin/python3 tools/plot_bench.py --ratio --collective "$collective" $([[ $collective == broadcast ]] && echo --in-place) \
      --out "$out/every-p$p-$collective.png" "$out"/every-p$p-?.json >/dev/null
  done
done
/usr/bin/python3 tools/bench_table.py matrix gloo "$out"/every-p2-?.json >"$out/every-gloo-p2.md"
for f in peers p4 p8 shared; do /usr/bin/python3 tools/bench_table.py peers "$out/$f.json" >"$out/$f.md"; done
/usr/bin/python3 tools/bench_table.py automatic "$out/automatic.json" >"$out/automatic.md"
/usr/bin/python3 tools/bench_table.py automatic "$out"/automatic-model-?.json >"$out/automatic-model.md"
/usr/bin/python3 tools/plot_bench.py --ratio --out "$out/peers.png" "$out/peers.json"
bash scripts/bench_cluster.sh "$out" || echo "bench.sh: no cluster table (scripts/bench_cluster.sh exited $?)"
echo "results in $out/"
