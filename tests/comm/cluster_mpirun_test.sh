#!/usr/bin/env bash
# The emulated cluster under Open MPI's mpirun (scripts/cluster.sh --mpirun): 2 hosts x 2 ranks at
# 1 Gbit/s. First `collectives_program cluster` (every collective and algorithm, every result
# checked exactly), bootstrapped through MPI. Then tutti-bench beside MPI and Gloo on the same
# links, which exits non-zero on any wrong result of Tutti or of a peer: it must report 4 ranks
# over shm+tcp (shared memory inside a host, TCP across, so each daemon ran in its host's namespace
# with its name), and both hosts' links must have carried its traffic. (Each rank's init line, as
# cluster_test.sh checks it, is not read here: mpirun forwards each daemon's output in chunks that
# may cut a line of a rank that prints a lot, and another rank's chunk can land in between.)
# Usage: cluster_mpirun_test.sh CLUSTER_SH MP_COLLECTIVES TUTTI_BENCH. Exits 77 where the cluster
# cannot be built (not root, no iproute2 or tbf) or Open MPI is missing.
set -u
cluster=$1 program=$2 bench=$3
unset TUTTI_TRANSPORT TUTTI_ALGO TUTTI_STORE
out=$(mktemp)
trap 'rm -f "$out"' EXIT
source "$(dirname "$0")/cluster_checks.sh"
# TERM, not KILL: cluster.sh then removes what it made.
timeout -k 10 170 bash "$cluster" --mpirun --hosts 2 --ranks 2 --rate 1gbit --timeout 150 \
  -- "$program" cluster >"$out" 2>&1
status=$?
if [[ $status -eq 77 ]]; then
  grep SKIPPED "$out"
  exit 77
fi
[[ $status -eq 0 ]] || { echo "FAIL: collectives_program exited with status $status"; failed=1; }
expect "every case passed" '^\[0\] [1-9][0-9]* passed, 0 failed$'
passed=$(grep -E '^\[0\] [0-9]+ passed' "$out" | sed 's/^\[0\] //')
((failed)) && { echo "--- output (last 40 lines) ---"; tail -n 40 "$out"; }

timeout -k 10 120 bash "$cluster" --mpirun --hosts 2 --ranks 2 --rate 1gbit --timeout 100 -- "$bench" --no-progress \
  --collective allreduce,alltoall,broadcast -b 8 -e 64K -f 64 -n 2 -w 1 --peers mpi,gloo >"$out" 2>&1
status=$?
[[ $status -eq 0 ]] || { echo "FAIL: tutti-bench beside MPI and Gloo exited with status $status"; failed=1; }
expect "tutti-bench ran on 4 ranks over shm+tcp" '^\[0\] # tutti-bench: 4 ranks over shm\+tcp'
rows=$(grep -cE '^\[0\] +[0-9]+ +[0-9]+ ' "$out")
((rows == 9)) || { echo "FAIL: expected 9 rows (3 collectives x 3 sizes: 8 B, 512 B, 32 KiB), got $rows"; failed=1; }
# Each row's last columns: MPI's bus bandwidth and tutti/mpi, then Gloo's (a dash where Gloo has
# no such collective), then the algorithm: MPI ran every row.
if grep -E '^\[0\] +[0-9]+ +[0-9]+ ' "$out" | awk '{ if ($(NF-4) == "-" || $(NF-3) == "-") bad = 1 } END { exit !bad }'; then
  echo "FAIL: a row without MPI's time"
  failed=1
fi
# 3 collectives of up to 32 KiB blocks beside 2 peers: well over 100 kB each way on each link.
links_carried 100000
if ((failed)); then
  echo "--- output (last 40 lines) ---"
  tail -n 40 "$out"
else
  echo "under mpirun on 2 hosts x 2 ranks: $passed; tutti-bench beside MPI and Gloo: $rows rows, every result right"
fi
exit "$failed"
