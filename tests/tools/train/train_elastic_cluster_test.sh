#!/usr/bin/env bash
# tutti-train --elastic on the emulated cluster (scripts/cluster.sh: 2 hosts x 2 ranks, network
# namespaces, links at 1 Gbit/s; shared memory within a host, TCP across), and host1 lost once
# training runs: its link goes down at both ends and its processes are killed, so host0's ranks
# see silence, no closed connection. They time out (TUTTI_TIMEOUT_MS), wait out the rendezvous
# timeout for host1's ranks (a pid on another host says nothing), go on as 2 from their last
# commit and finish with identical parameters; the job's status is 0.
#
#   train_elastic_cluster_test.sh CLUSTER_SH PATH/TO/tutti-train [DATA_DIR]
# Exits 77 where cluster.sh cannot build the cluster (not root, no iproute2 or tbf) or the
# Fashion-MNIST files are not installed.
set -u
cluster=$1
train=$2
data=${3:-/usr/share/datasets/fashion-mnist}
run=unused
source "$(dirname "$0")/train_harness.sh"
# TERM, not KILL: cluster.sh then removes what it made.
TUTTI_TIMEOUT_MS=4000 TUTTI_ELASTIC_TIMEOUT_MS=3000 timeout -k 10 200 bash "$cluster" --hosts 2 --ranks 2 \
  --timeout 180 --elastic --lose-host '1:^\[0\] tutti-train: step 12 ' -- "$train" --elastic --epochs 1 \
  --train-samples 8192 --test-samples 1000 --batch-size 64 --lr 0.05 --threads 1 --commit-every 5 --log-interval 1 \
  --data "$data" >"$tmp/out" 2>"$tmp/err"
status=$?
if [[ $status -eq 77 ]]; then
  grep SKIPPED "$tmp/out"
  exit 77
fi
name="a host lost on the emulated cluster"
expect() {
  grep -qE "$1" "$tmp/out" "$tmp/err" && return 0
  fail "$name" "$2"
  return 1
}
check() {
  [[ $status -eq 0 ]] || { fail "$name" "the job exited with status $status"; return; }
  expect '^cluster.sh: host1 lost' "host1 was not lost" || return
  expect '^\[0\] tutti-train: elastic generation 1: 2 ranks, from epoch 1 sample [0-9]+ \(step [0-9]*[05]\), [0-9]+ ms' \
    "host0's ranks did not go on as 2 from a commit" || return
  expect 'generation 1: 2 rank\(s\); lost host1:[0-9]+:[0-9a-f]+ \(did not arrive in time\), host1:' \
    "host1's ranks were not named as lost" || return
  expect '^\[0\] tutti-train: parameters identical on all 2 ranks' "no 'parameters identical on all 2 ranks' line" ||
    return
  expect '^\[0\] tutti-train: summary .* ranks=2 generation=1$' "no summary line" || return
  grep -h 'elastic generation\|test_acc\|lost' "$tmp/out" "$tmp/err"
  ok "$name"
}
check
echo "passed $passed, failed $failed"
[[ $failed -eq 0 ]]
