#!/usr/bin/env bash
# Elastic jobs (include/tutti/elastic.hpp) with ranks as processes started by hand, as a launcher
# would start them, over a private file store:
#   kill   rank 2 of 4 is killed (SIGKILL) mid-run, a new rank joins while the 3 survivors train:
#          every rank ends with the exact state, on 4 ranks, in a later generation;
#   stop   rank 1 of 3 stops (SIGSTOP): the others time out, go on as 2 and finish; continued,
#          the stopped rank is refused by name;
#   closer the rank closing a rendezvous is killed while it waits: another takes over;
#   leave  rank 3 of 4 leaves (Job::leave) and exits: the others go on as 3 at once;
#   min    with a minimum of 3 ranks, losing 1 of 3 ends the job on every survivor with a clear
#          error, and the last committed state is in the checkpoint, from which the job started
#          again goes on (one that cannot be read is an error, not a fresh start);
#   host   (tcp) two emulated hosts, one lost whole: the others wait out the timeout, go on;
#   bounds a minimum above the maximum is refused;
# and through tutti-run --elastic: a rank killed, SIGUSR1 starts a joiner, a rank started by hand
# from join.env joins, the usage errors; the job's store directory and segments are gone after.
# Each case bounds its time; the store and any shared-memory segment of the job are removed.
#
#   elastic_test.sh ELASTIC_PROGRAM TRANSPORT TUTTI_RUN
set -uo pipefail
program=$1
transport=$2
tutti_run=$3
work=$(mktemp -d)
chmod 700 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do pkill -KILL -P "$pid" 2>/dev/null; pkill -CONT -P "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
  rm -f /dev/shm/tutti-*elastic-$$-* 2>/dev/null
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for f in "$work"/*.out "$work"/*.err; do [[ -f $f ]] && { echo "--- $(basename "$f")"; cat "$f"; }; done
  exit 1
}

export TUTTI_TRANSPORT=$transport TUTTI_TOKEN=elastic-test-token-$$
case_number=0
# start NAME [VAR=VALUE...] -- ARGS: one rank in the background, its output in WORK/NAME.out; pid_NAME
# is its `timeout`, whose child is the rank.
start() {
  local name=$1
  shift
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  env -u TUTTI_RANK -u TUTTI_SIZE "${vars[@]}" timeout 120 "$program" "$@" >"$work/$name.out" 2>&1 &
  pids+=($!)
  eval "pid_$name=$!"
}
# new_job: a store and job id of its own for the next case.
new_job() {
  case_number=$((case_number + 1))
  export TUTTI_JOB_ID=elastic-$$-$case_number
  mkdir -m 700 "$work/store$case_number"
  export TUTTI_STORE=file://$work/store$case_number
}
expect_exit() {  # NAME CODE
  local pid_var=pid_$1
  wait "${!pid_var}"
  local code=$?
  [[ $code == "$2" ]] || fail "$1 exited with $code, expected $2"
}
expect_line() {  # NAME PATTERN
  grep -qE "$2" "$work/$1.out" || fail "$1 printed no line matching '$2'"
}
await_line() {  # NAME PATTERN: within 60 s
  for _ in $(seq 600); do grep -qE "$2" "$work/$1.out" && return; sleep 0.1; done
  fail "$1 printed no line matching '$2' within 60 s"
}

steps=600
# ---- kill: 4 ranks, rank 2 killed at step 62 (back to the commit at 60); once the 3 others go on, a rank joins ----
new_job
for r in 0 1 2 3; do start k$r TUTTI_RANK=$r TUTTI_SIZE=4 TUTTI_TIMEOUT_MS=20000 -- $steps 5 10 2 62 kill; done
expect_exit k2 137
await_line k0 "^generation 1: rank 0 of 3 from step 60 after [0-9]+ ms$"
start kj TUTTI_ELASTIC_JOIN=1 TUTTI_TIMEOUT_MS=20000 -- $steps 5 10
for r in 0 1 3; do
  expect_exit k$r 0
  expect_line k$r "^done rank [0-2] of 4 generation 2 steps $steps recovered_ms [0-9]+"
done
expect_exit kj 0
expect_line kj "^generation 2: rank 3 of 4 from step [0-9]*[05] after -1 ms$"
expect_line kj "^done rank 3 of 4 generation 2 steps $steps"
echo "ok: kill -9 one rank of 4, a rank joins: 4 ranks finish with the exact state"
grep -h "^generation\|^done" "$work"/k0.out "$work"/kj.out

# ---- stop: 3 ranks, rank 1 stops at step 42; 2 go on from 40; continued, rank 1 is refused ----
new_job
for r in 0 1 2; do
  start s$r TUTTI_RANK=$r TUTTI_SIZE=3 TUTTI_TIMEOUT_MS=3000 TUTTI_ELASTIC_TIMEOUT_MS=3000 -- 200 5 10 1 42 stop
done
for r in 0 2; do
  expect_exit s$r 0
  expect_line s$r "^done rank [01] of 2 generation 1 steps 200"
done
pkill -CONT -P "$pid_s1"
expect_exit s1 1
expect_line s1 "^error: elastic: .*:[0-9]+:[0-9a-f]+ \(rank 1 of generation 0\) is not a member of generation 1"
echo "ok: a stopped rank of 3 is left behind after the timeout; continued, it is refused by name"

# ---- closer: rank 1 of 4 stops at step 42; the first survivor to arrive closes the rendezvous and
# waits for it; the test kills that closer, and the two others take over, leave both out and go on
# as 2 ----
new_job
for r in 0 1 2 3; do
  start c$r TUTTI_RANK=$r TUTTI_SIZE=4 TUTTI_TIMEOUT_MS=3000 TUTTI_ELASTIC_TIMEOUT_MS=4000 TUTTI_DEBUG=info \
    -- 200 5 10 1 42 stop
done
closer=
for _ in $(seq 600); do
  closer=$(grep -hoE 'elastic: [^ ]+ closes generation 1$' "$work"/c[0-3].out | head -1 | cut -d' ' -f2)
  [[ -n $closer ]] && break
  sleep 0.1
done
[[ -n $closer ]] || fail "no rank began closing generation 1"
kill -KILL "$(echo "$closer" | cut -d: -f2)"
survivors=()
for r in 0 2 3; do grep -qF "elastic: $closer closes generation 1" "$work/c$r.out" || survivors+=("$r"); done
((${#survivors[@]} == 2)) || fail "not two survivors besides the closer: ${survivors[*]}"
for r in "${survivors[@]}"; do
  expect_exit c$r 0
  expect_line c$r "^done rank [01] of 2 generation 1 steps 200"
done
grep -hqE "takes over closing generation 1 from $closer, which is gone" "$work"/c[0-3].out ||
  fail "no survivor took over from the closer $closer"
pkill -CONT -P "$pid_c1"
expect_exit c1 1
echo "ok: the rank closing a rendezvous killed while it waits: another takes over and the job goes on"

# ---- leave: rank 3 of 4 leaves at step 30; the others go on as 3 without waiting ----
new_job
for r in 0 1 2 3; do
  start l$r TUTTI_RANK=$r TUTTI_SIZE=4 TUTTI_TIMEOUT_MS=20000 TUTTI_ELASTIC_TIMEOUT_MS=20000 -- 150 5 10 3 30 leave
done
expect_exit l3 0
for r in 0 1 2; do
  expect_exit l$r 0
  expect_line l$r "^done rank [0-2] of 3 generation 1 steps 150"
done
echo "ok: a rank that leaves is not waited for"

# ---- min: a minimum of 3, rank 0 of 3 killed: the job ends with the state in the checkpoint ----
new_job
for r in 0 1 2; do
  start m$r TUTTI_RANK=$r TUTTI_SIZE=3 TUTTI_TIMEOUT_MS=20000 TUTTI_ELASTIC_MIN_RANKS=3 \
    ELASTIC_CHECKPOINT="$work/last.state" -- 200 7 10 0 50 kill
done
expect_exit m0 137
for r in 1 2; do
  expect_exit m$r 1
  expect_line m$r "^error: elastic: generation 1: 2 rank\(s\); lost .* \(gone\).*fewer than the minimum of 3 ranks, the job ends; the last committed state is in $work/last.state"
done
[[ $(stat -c %a "$work/last.state") == 600 ]] || fail "the checkpoint's mode is $(stat -c %a "$work/last.state"), not 600"
# The checkpoint: step (u64) then 257 doubles, each equal to the step, a multiple of 7 by step 49.
python3 - "$work/last.state" <<'EOF' || fail "the checkpoint does not hold the last commit"
import struct, sys
data = open(sys.argv[1], "rb").read()
assert len(data) == 8 + 257 * 8, len(data)
step = struct.unpack_from("<Q", data)[0]
x = struct.unpack_from("<257d", data, 8)
assert step == 49, step
assert all(v == step for v in x), x[:3]
print(f"ok: the checkpoint holds the commit at step {step}")
EOF
echo "ok: below the minimum every survivor ends with a clear error, the last commit in the checkpoint"
# The same job started again with the checkpoint goes on from it, on the ranks it has.
new_job
for r in 0 1; do
  start c$r TUTTI_RANK=$r TUTTI_SIZE=2 TUTTI_TIMEOUT_MS=20000 TUTTI_ELASTIC_CHECKPOINT="$work/last.state" -- 200 7 10
done
for r in 0 1; do
  expect_exit c$r 0
  expect_line c$r "^generation 0: rank $r of 2 from step 49 after -1 ms$"
  expect_line c$r "^done rank $r of 2 generation 0 steps 200"
done
echo "ok: a job started with TUTTI_ELASTIC_CHECKPOINT goes on from the last commit"
# A checkpoint there that cannot be read (a directory) is an error, not a fresh start.
new_job
start u0 TUTTI_RANK=0 TUTTI_SIZE=1 TUTTI_ELASTIC_CHECKPOINT="$work" -- 10 5 0
expect_exit u0 1
expect_line u0 "^error: elastic: cannot read the checkpoint $work that a job below its minimum of ranks left"
echo "ok: a checkpoint that cannot be read is an error"

# ---- host (tcp only): two emulated hosts of 2 ranks (TUTTI_HOST; shm within, tcp across), host 1
# lost (both its ranks killed). A pid on another host says nothing here, so the survivors wait out
# the rendezvous timeout (3 s), then go on as 2 ----
if [[ $transport == tcp ]]; then
  new_job
  for r in 0 1 2 3; do
    start h$r TUTTI_RANK=$r TUTTI_SIZE=4 TUTTI_HOST=host$((r / 2)) TUTTI_TRANSPORT= TUTTI_TIMEOUT_MS=20000 \
      TUTTI_ELASTIC_TIMEOUT_MS=3000 -- 200 5 10 2,3 40 kill
  done
  expect_exit h2 137
  expect_exit h3 137
  for r in 0 1; do
    expect_exit h$r 0
    expect_line h$r "^done rank $r of 2 generation 1 steps 200"
  done
  grep -hqE "generation 1: 2 rank\(s\); lost host1:[0-9]+:[0-9a-f]+ \(did not arrive in time\), host1:[0-9]+:[0-9a-f]+ \(did not arrive in time\).*closed in (29[0-9][0-9]|3[0-9]{3}) ms" \
    "$work/h0.out" "$work/h1.out" || fail "the survivors did not wait out the timeout for host 1's ranks"
  echo "ok: a whole emulated host lost: the other host's ranks wait out the timeout and go on"
fi

# ---- bounds ----
new_job
start b0 TUTTI_RANK=0 TUTTI_SIZE=1 TUTTI_ELASTIC_MIN_RANKS=5 TUTTI_ELASTIC_MAX_RANKS=4 -- 10 5 0
expect_exit b0 1
expect_line b0 "^error: elastic: min_ranks 5 and max_ranks 4 .* do not bound any size"
echo "ok: bounds that admit no size are refused"

shopt -s nullglob
left=(/dev/shm/tutti-*elastic-$$-*)
((${#left[@]} == 0)) || fail "segments left behind: ${left[*]}"

# ---- tutti-run --elastic ----
unset TUTTI_STORE TUTTI_JOB_ID TUTTI_TOKEN
export TMPDIR=$work
# run_job NAME ARGS...: tutti-run in the background, bounded; its stdout in NAME.out, stderr in
# NAME.err; pid_NAME is the timeout's, tr_NAME tutti-run's own.
run_job() {
  local name=$1
  shift
  timeout -s KILL 120 "$tutti_run" --transport "$transport" "$@" >"$work/$name.out" 2>"$work/$name.err" &
  eval "pid_$name=$!"
  pids+=($!)
  local timeout_pid=$!
  for _ in $(seq 100); do
    tr=$(pgrep -P "$timeout_pid" -x tutti-run) && break
    sleep 0.05
  done
  eval "tr_$name=$tr"
}
# The kill case under tutti-run; once the 3 survivors train, SIGUSR1 starts a joiner.
run_job r1 -n 4 --elastic --min-ranks 2 --max-ranks 4 -x TUTTI_TIMEOUT_MS=20000 -- "$program" 600 5 10 2 60 kill
await_line r1 "^\[[0-9]\] generation 1: rank 0 of 3 from step 60"
kill -USR1 "$tr_r1"
expect_exit r1 0
[[ $(grep -c "^\[[0-9]\] done rank [0-3] of 4 generation 2 steps 600" "$work/r1.out") == 4 ]] ||
  fail "tutti-run --elastic: not 4 ranks done in generation 2"
grep -q "^\[4\] done rank 3 of 4" "$work/r1.out" || fail "the joiner (tagged [4]) did not finish as rank 3"
grep -q "rank 2 (pid [0-9]*) killed by signal 9 (Killed); the elastic job goes on without it" "$work/r1.err" ||
  fail "tutti-run did not report the killed rank"
grep -q "started a rank that joins the job (output tagged \[4\]" "$work/r1.err" || fail "no report of the joiner"
store=$(sed -n 's|.*env $(cat \(.*\)/join.env) PROGRAM$|\1|p' "$work/r1.err")
[[ -n $store && ! -e $store ]] || fail "tutti-run's store directory '$store' is left behind"
echo "ok: tutti-run --elastic: a rank killed, SIGUSR1 starts one that joins, 4 ranks finish"

# A rank started by hand from join.env joins a job of 3. It lingers 1 s after the job is done: the
# end of tutti-run (whose own ranks are gone) leaves it the time to end by itself.
run_job r2 -n 3 --elastic -x TUTTI_TIMEOUT_MS=20000 -- "$program" 1000 5 10
for _ in $(seq 100); do grep -q 'join.env' "$work/r2.err" && break; sleep 0.05; done
join_file=$(sed -n 's|.*env $(cat \(.*/join.env\)) PROGRAM$|\1|p' "$work/r2.err")
[[ -f $join_file && $(stat -c %a "$join_file") == 600 ]] || fail "no join.env of mode 600 ('$join_file')"
grep -q '^TUTTI_ELASTIC_JOIN=1$' "$join_file" || fail "join.env lacks TUTTI_ELASTIC_JOIN=1"
# shellcheck disable=SC2046
env -u TUTTI_RANK -u TUTTI_SIZE $(cat "$join_file") ELASTIC_LINGER_MS=1000 timeout 120 "$program" 1000 5 10 \
  >"$work/hand.out" 2>&1 &
pid_hand=$!
pids+=($!)
expect_exit r2 0
expect_exit hand 0
expect_line hand "^done rank 3 of 4 generation 1 steps 1000"
[[ $(grep -c "done rank [0-2] of 4 generation 1 steps 1000" "$work/r2.out") == 3 ]] ||
  fail "the 3 ranks of tutti-run did not finish with the rank started by hand"
echo "ok: a rank started by hand with join.env joins"

# Usage.
"$tutti_run" -n 2 --min-ranks 2 true >"$work/u.out" 2>&1
[[ $? == 2 ]] && grep -q "need --elastic" "$work/u.out" || fail "--min-ranks without --elastic was not refused"
"$tutti_run" -n 5 --elastic --max-ranks 4 true >"$work/u.out" 2>&1
[[ $? == 2 ]] && grep -q "\-n 5 is more than --max-ranks 4" "$work/u.out" || fail "-n above --max-ranks was not refused"
echo "ok: tutti-run refuses bounds it cannot keep"
echo "PASSED"
