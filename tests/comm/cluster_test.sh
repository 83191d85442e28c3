#!/usr/bin/env bash
# The emulated cluster's short run: 2 hosts x 2 ranks, links at 1 Gbit/s (scripts/cluster.sh),
# running `collectives_program cluster` (the collective sweep with automatic and every algorithm, large
# automatic allreduces, splits; every result checked exactly) under TUTTI_DEBUG=info, then checks
# that the ranks of a host talked through shared memory and the hosts through TCP (the init line
# of each rank, and bytes on both hosts' links), that init measured the link alike on every rank,
# and that automatic chose hierarchical.
# Usage: cluster_test.sh CLUSTER_SH MP_COLLECTIVES. Exits 77 where cluster.sh cannot build the
# cluster (not root, no iproute2 or tbf).
set -u
cluster=$1 program=$2
unset TUTTI_TRANSPORT TUTTI_ALGO  # the defaults are what is checked
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# TERM, not KILL: cluster.sh then removes what it made.
TUTTI_DEBUG=info timeout -k 10 150 bash "$cluster" --hosts 2 --ranks 2 --rate 1gbit --timeout 120 \
  -- "$program" cluster >"$out" 2>&1
status=$?
if [[ $status -eq 77 ]]; then
  grep SKIPPED "$out"
  exit 77
fi
source "$(dirname "$0")/cluster_checks.sh"
[[ $status -eq 0 ]] || { echo "FAIL: the job exited with status $status"; failed=1; }
expect "every case passed" '^\[0\] [1-9][0-9]* passed, 0 failed$'
for r in 0 1; do
  expect "rank $r: shared memory with rank 0 and 1, TCP to 2 and 3" \
    "^\[$r\] tutti\[$r\] INFO: init: transport shm\+tcp: shared memory with ranks 0,1 \(this host\), TCP to the other 2 ranks on 1 other host$"
done
for r in 2 3; do
  expect "rank $r: shared memory with rank 2 and 3, TCP to 0 and 1" \
    "^\[$r\] tutti\[$r\] INFO: init: transport shm\+tcp: shared memory with ranks 2,3 \(this host\), TCP to the other 2 ranks on 1 other host$"
done
# init measured the 1 Gbit/s link (rank 0 to rank 2, the first on the other host) for the cost model,
# and every rank took rank 0's values.
link_probed 4 0.5 1.5
# The emulated hosts share this machine's cores: init counted all 4 ranks on it (and so waits
# yield the cores where 4 outnumber them), whatever the hosts' names.
for r in 0 1 2 3; do
  expect "rank $r counted the job's 4 ranks on this machine" "^\[$r\] tutti\[$r\] INFO: init: 4 ranks of the job on this machine"
done
expect "automatic chose hierarchical across the hosts" 'INFO: hierarchical: 2 hosts, 2 ranks on mine, equal on every host'
# The large allreduces alone move megabytes between the hosts: at least 1 MB each way on each link.
links_carried 1000000
if ((failed)); then
  echo "--- output (last 60 lines) ---"
  tail -n 60 "$out"
else
  echo "2 hosts x 2 ranks at 1gbit: $(grep -E '^\[0\] [0-9]+ passed' "$out" | sed 's/^\[0\] //'), shm within hosts, tcp across"
fi
exit "$failed"
