#!/usr/bin/env bash
# tutti-train --elastic under tutti-run --elastic, 4 ranks: rank 2 is killed (SIGKILL) once
# training runs, the 3 others go back to their last commit and on; then SIGUSR1 starts a rank that
# joins at the next commit, and the job ends on 4 ranks with identical parameters, the loss
# falling. Over shm without compression, over shm with top-k (error feedback), and over TCP. And a
# rank stopped (SIGSTOP) is removed after the timeout, and a whole emulated host lost over TCP.
# Every run is bounded by `timeout`; the job's store and segments are gone after.
#
#   train_elastic_test.sh PATH/TO/tutti-run PATH/TO/tutti-train [DATA_DIR]
# Exits 77 (skipped) when the Fashion-MNIST files are not installed.
set -u
run=$1
train=$2
data=${3:-/usr/share/datasets/fashion-mnist}
source "$(dirname "$0")/train_harness.sh"
flags=(--elastic --epochs 2 --train-samples 8192 --test-samples 1000 --batch-size 64 --lr 0.05 --threads 1
  --commit-every 5 --log-interval 1 --data "$data")

# await PATTERN: within 120 s, a line of tutti-run's output.
await() {
  for _ in $(seq 1200); do
    grep -qE "$1" "$tmp/out" "$tmp/err" && return 0
    sleep 0.1
  done
  return 1
}
# The pid of the tutti-train process of rank R of generation 0 (by its environment).
rank_pid() {
  local p
  for p in $(pgrep -x tutti-train); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TUTTI_RANK=$1" &&
      tr '\0' '\n' <"/proc/$p/environ" | grep -qx "TUTTI_JOB_ID=$2" && echo "$p"
  done
}

# expect PATTERN WHY [FILE]: a line of FILE ($tmp/out) matches PATTERN (ERE), else case $name fails.
expect() {
  grep -qE "$1" "${3:-$tmp/out}" && return 0
  fail "$name" "$2"
  return 1
}

# succeeded PID: the job PID ends with status 0, else case $name fails.
succeeded() {
  wait "$1"
  status=$?
  [[ $status -eq 0 ]] && return 0
  fail "$name" "exit status $status"
  return 1
}

case_kill_join() {
  local name=$1
  shift
  timeout -s KILL 300 "$run" -n 4 --elastic "$@" "$train" "${flags[@]}" >"$tmp/out" 2>"$tmp/err" &
  local job=$!
  await '^\[0\] tutti-train: step 12 ' || { fail "$name" "training did not reach step 12"; wait $job; return; }
  local id
  id=$(sed -n 's|.*/tutti-\([0-9a-f]\{16\}\)/join.env.*|\1|p' "$tmp/err")
  local victim
  victim=$(rank_pid 2 "$id")
  [[ -n $victim ]] || { fail "$name" "no process of rank 2"; wait $job; return; }
  kill -KILL "$victim"
  await '^\[0\] tutti-train: elastic generation 1: 3 ranks, from epoch 1 sample [0-9]+ \(step (5|10|15)\)' ||
    { fail "$name" "the 3 survivors did not go on from a commit"; wait $job; return; }
  local tutti_run
  tutti_run=$(pgrep -P $job -x tutti-run)
  kill -USR1 "$tutti_run"
  succeeded $job || return
  expect '^\[0\] tutti-train: elastic generation 2: 4 ranks, from epoch [12] sample [0-9]+ \(step [0-9]*[05]\)' \
    "the joiner did not come in at a commit" || return
  expect '^\[0\] tutti-train: parameters identical on all 4 ranks \(checksum 0x[0-9a-f]{16}\)$' \
    "no 'parameters identical on all 4 ranks' line" || return
  expect '^\[0\] tutti-train: summary .* ranks=4 generation=2$' "no summary line" || return
  local loss1 loss2
  loss1=$(awk '$1 == "[0]" && $2 == "tutti-train:" && $3 == "step" && $4 == "1" { print $8 }' "$tmp/out")
  loss2=$(awk '$1 == "[0]" && $2 == "epoch" && $3 == "2/2" { print $5 }' "$tmp/out")
  awk -v a="$loss1" -v b="$loss2" 'BEGIN { exit !(a != "" && b != "" && b < a / 2) }' ||
    { fail "$name" "the loss did not fall to half: first step $loss1, epoch 2 $loss2"; return; }
  [[ ! -e /tmp/tutti-$id && -z $(ls /dev/shm | grep "^tutti-$id") ]] ||
    { fail "$name" "the job's store or segments are left behind"; return; }
  grep -h 'elastic generation\|test_acc' "$tmp/out"
  ok "$name"
}

case_kill_join "kill and join over shm" --transport shm
flags+=(--compression topk:0.1)
case_kill_join "kill and join with top-k" --transport shm
flags=("${flags[@]:0:${#flags[@]}-2}")
case_kill_join "kill and join over tcp" --transport tcp

# A hung rank: rank 1 of 3 is stopped (SIGSTOP) once training runs. The others time out, leave it
# behind after the rendezvous timeout and finish on 2 ranks; continued then, it is refused by name.
case_stop() {
  local name="a stopped rank is removed after the timeout"
  timeout -s KILL 300 "$run" -n 3 --elastic -x TUTTI_TIMEOUT_MS=3000 -x TUTTI_ELASTIC_TIMEOUT_MS=3000 "$train" \
    "${flags[@]}" --epochs 1 >"$tmp/out" 2>"$tmp/err" &
  local job=$!
  await '^\[0\] tutti-train: step 12 ' || { fail "$name" "training did not reach step 12"; wait $job; return; }
  local id victim
  id=$(sed -n 's|.*/tutti-\([0-9a-f]\{16\}\)/join.env.*|\1|p' "$tmp/err")
  victim=$(rank_pid 1 "$id")
  [[ -n $victim ]] || { fail "$name" "no process of rank 1"; wait $job; return; }
  kill -STOP "$victim"
  await '^\[0\] tutti-train: summary .* ranks=2 generation=1$' ||
    { kill -CONT "$victim"; fail "$name" "the 2 others did not finish"; wait $job; return; }
  kill -CONT "$victim"
  succeeded $job || return
  expect '^\[0\] tutti-train: elastic generation 1: 2 ranks, from epoch 1 sample [0-9]+ \(step [0-9]*[05]\), [0-9]+ ms' \
    "the 2 survivors did not go on from a commit" || return
  expect '^\[0\] tutti-train: parameters identical on all 2 ranks' "no 'parameters identical on all 2 ranks' line" ||
    return
  expect '^\[1\] tutti-train: error: elastic: .* \(rank 1 of generation 0\) is not a member of generation 1' \
    "the continued rank was not refused by name" "$tmp/err" || return
  grep -h 'elastic generation\|test_acc\|not a member' "$tmp/out" "$tmp/err"
  ok "$name"
}
case_stop

# A whole host lost, over TCP: ranks started by hand as two emulated hosts of 2 (TUTTI_HOST; shm
# within a host, TCP across), both ranks of host1 killed. A pid on another host says nothing, so
# the others wait out the rendezvous timeout, then finish on 2 ranks with identical parameters.
case_host() {
  local name="a whole emulated host lost over tcp"
  local store=$tmp/store r
  mkdir -m 700 "$store"
  local hpids=()
  for r in 0 1 2 3; do
    env TUTTI_STORE="file://$store" TUTTI_JOB_ID="elastic-train-$$" TUTTI_TOKEN="elastic-train-token-$$" \
      TUTTI_RANK=$r TUTTI_SIZE=4 TUTTI_HOST=host$((r / 2)) TUTTI_TIMEOUT_MS=20000 TUTTI_ELASTIC_TIMEOUT_MS=3000 \
      timeout -s KILL 300 "$train" "${flags[@]}" --epochs 1 >"$tmp/h$r.out" 2>&1 &
    hpids+=($!)
  done
  local reached=
  for _ in $(seq 1200); do
    grep -q '^tutti-train: step 12 ' "$tmp/h0.out" && { reached=1; break; }
    sleep 0.1
  done
  [[ -n $reached ]] || { cat "$tmp"/h*.out >"$tmp/out"; fail "$name" "training did not reach step 12"; kill -KILL "${hpids[@]}"; wait 2>/dev/null; return; }
  # Both at once: stopped first (a stopped rank keeps its sockets, so neither sees the other go and
  # comes to the next rendezvous before it dies too), then killed.
  pkill -STOP -P "${hpids[2]}"
  pkill -STOP -P "${hpids[3]}"
  pkill -KILL -P "${hpids[2]}"
  pkill -KILL -P "${hpids[3]}"
  wait "${hpids[0]}"
  local s0=$?
  wait "${hpids[1]}"
  local s1=$?
  wait 2>/dev/null
  cat "$tmp"/h0.out "$tmp"/h1.out >"$tmp/out"
  [[ $s0 -eq 0 && $s1 -eq 0 ]] || { fail "$name" "the survivors exited with $s0 and $s1"; return; }
  expect 'generation 1: 2 rank\(s\); lost host1:[0-9]+:[0-9a-f]+ \(did not arrive in time\), host1:' \
    "the survivors did not name host1's ranks as lost after the timeout" || return
  expect '^tutti-train: elastic generation 1: 2 ranks, from epoch 1 sample [0-9]+ \(step [0-9]*[05]\)' \
    "the 2 survivors did not go on from a commit" || return
  expect '^tutti-train: parameters identical on all 2 ranks' "no 'parameters identical on all 2 ranks' line" || return
  [[ -z $(ls /dev/shm | grep "elastic-train-$$") ]] || { fail "$name" "segments left behind"; return; }
  grep -h 'elastic generation\|test_acc' "$tmp/h0.out"
  ok "$name"
}
case_host

# Bad combinations are refused before any rank starts.
timeout 30 "$train" --elastic --zero 1 >"$tmp/out" 2>&1
[[ $? -eq 2 ]] && grep -q 'elastic is for data parallelism alone' "$tmp/out" && ok "--elastic --zero refused" ||
  fail "--elastic --zero" "not refused"

echo "passed $passed, failed $failed"
[[ $failed -eq 0 ]]
