#!/usr/bin/env bash
# Soak: a long seeded run of mixed collectives at p = 4 over shm and tcp (results checked, memory
# flat, nothing left behind), and runs in which one rank, drawn at random, is killed (SIGKILL) at
# a random moment: every survivor must report peer_failure naming it (or aborted) within the
# run's timeout plus a little, tutti-run must exit non-zero naming the killed rank, and no
# process, /dev/shm segment or store directory of the job may be left.
#
# Usage: soak_test.sh TUTTI_RUN SOAK_PROGRAM
# Environment (defaults: the short version ctest runs):
#   SOAK_SMALL=10000 SOAK_LARGE=100   calls per clean run and transport
#   SOAK_KILLS=1                      kill runs per transport
#   SOAK_TRANSPORTS="shm tcp"         SOAK_RANKS=4
#   SOAK_SEED                         seed of the clean runs (default: drawn, and printed)
#   SOAK_RSS_BOUND_MIB=16             allowed growth of a rank's resident set after warm-up
#   SOAK_KILL_TIMEOUT_MS=5000         --timeout-ms of the kill runs; the bound on detection is
#                                     this plus SOAK_KILL_SLACK_MS=2000
#   SOAK_RUN_LIMIT_S=600              wall-clock limit of one clean run
#   SOAK_REPORTS=5                    progress lines per rank in a clean run
set -u
run=$1 program=$2
small=${SOAK_SMALL:-10000} large=${SOAK_LARGE:-100} kills=${SOAK_KILLS:-1}
transports=${SOAK_TRANSPORTS:-shm tcp} n=${SOAK_RANKS:-4}
seed=${SOAK_SEED:-$(((RANDOM << 15) | RANDOM))}
rss_bound=${SOAK_RSS_BOUND_MIB:-16}
kill_timeout_ms=${SOAK_KILL_TIMEOUT_MS:-5000} kill_slack_ms=${SOAK_KILL_SLACK_MS:-2000}
run_limit=${SOAK_RUN_LIMIT_S:-600} reports=${SOAK_REPORTS:-5}
RANDOM=$seed
passed=0 failed=0
work=$(mktemp -d "${TMPDIR:-/tmp}/tutti-soak.XXXXXX")
trap 'rm -rf "$work"' EXIT
check() {  # NAME WHY-IF-NOT RESULT(0=ok)
  if [[ $3 -eq 0 ]]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1: $2"; failed=$((failed + 1)); fi
}
ok_if() { "$@" && echo 0 || echo 1; }
now_ns() { date +%s%N; }

# Checks that no rank of the job (PIDS) is alive and nothing of job JOB is left in /dev/shm or in
# the private TMPDIR the job's store directory was made in.
check_clean() {  # NAME JOB TMPDIR PIDS...
  local name=$1 job=$2 tmp=$3
  shift 3
  local alive="" pid
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive+=" $pid"; done
  check "$name: no rank left running" "alive:$alive" $(ok_if test -z "$alive")
  check "$name: job id seen" "none" $(ok_if test -n "$job")
  local segments
  segments=$(if [[ -n $job ]]; then compgen -G "/dev/shm/tutti-$job*"; fi)
  check "$name: no /dev/shm/tutti-$job* left" "$segments" $(ok_if test -z "$segments")
  local store
  store=$(ls -A "$tmp")
  check "$name: no store directory left" "$store" $(ok_if test -z "$store")
  [[ -n $alive ]] && kill -9 $alive 2>/dev/null
  return 0
}

pids_of() { sed -nE 's/^\[[0-9]+\] rank [0-9]+: pid ([0-9]+)$/\1/p' "$1"; }
job_of() {  # PID: the job id from the rank's environment (empty once it is gone)
  tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^TUTTI_JOB_ID=//p'
}

clean_run() {  # TRANSPORT
  local t=$1 name="soak $1 p=$n small=$small large=$large seed=$seed"
  local tmp=$work/tmp-$t-clean out=$work/out-$t-clean status start end
  mkdir -p "$tmp"
  start=$(now_ns)
  TMPDIR=$tmp timeout -s KILL "$run_limit" "$run" -n "$n" --transport "$t" --timeout-ms 60000 \
    "$program" --small "$small" --large "$large" --seed "$seed" --reports "$reports" --rss-bound-mib "$rss_bound" >"$out" 2>&1 &
  local runner=$! job=""
  while [[ -z $job ]] && kill -0 $runner 2>/dev/null; do  # the job id, while the ranks run
    local first
    first=$(pids_of "$out" | head -1)
    [[ -n $first ]] && job=$(job_of "$first")
    [[ -z $job ]] && sleep 0.05
  done
  wait $runner
  status=$?
  end=$(now_ns)
  grep -E "rank 0: progress|rank [0-9]+: done|WRONG|FAIL|killed|failed" "$out" | sed 's/^/    /'
  check "$name: exit 0" "status $status; last lines:
$(tail -20 "$out")" $(ok_if test $status -eq 0)
  local done_ok
  done_ok=$(grep -cE "rank [0-9]+: done small=$small large=[0-9]+ errors=0 .*growth_mib=[0-9.]+( RSS-UNCHECKED-UNDER-ASAN)?$" "$out")
  check "$name: $n ranks right, memory flat (+$rss_bound MiB)" "$done_ok of $n" $(ok_if test "$done_ok" -eq "$n")
  awk -v t="$t" -v wall=$(((end - start) / 1000000)) '
    / done small=/ {
      for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
      calls = v["small"] + v["large"]; errors += v["errors"]; if (v["seconds"] > s) s = v["seconds"]
      if (v["rss_start_mib"] > a) a = v["rss_start_mib"]; if (v["rss_base_mib"] > b) b = v["rss_base_mib"]
      if (v["rss_end_mib"] > e) e = v["rss_end_mib"]; if (v["growth_mib"] > g) g = v["growth_mib"]
      small = v["small"]; large = v["large"]; ranks++
    }
    END {
      if (ranks == 0) exit
      printf "figure soak %s: %d ranks, %d small + %d large calls in %.1f s (%.0f calls/s, %.1f s wall), " \
             "errors %d; RSS per rank (MiB, largest of the ranks): start %.1f, after warm-up %.1f, end %.1f, " \
             "growth after warm-up %.1f\n", t, ranks, small, large, s, calls / s, wall / 1000, errors, a, b, e, g
    }' "$out"
  # shellcheck disable=SC2046
  check_clean "$name" "$job" "$tmp" $(pids_of "$out")
}

kill_run() {  # TRANSPORT INDEX
  local t=$1 i=$2
  local kseed=$(((RANDOM << 15) | RANDOM))
  local tmp=$work/tmp-$t-kill$i out=$work/out-$t-kill$i
  local grace=$(((kill_timeout_ms + kill_slack_ms) / 1000 + 5))
  mkdir -p "$tmp"
  TMPDIR=$tmp timeout -s KILL 120 "$run" -n "$n" --transport "$t" --timeout-ms "$kill_timeout_ms" \
    --grace-period "$grace" "$program" --until-failure --seed "$kseed" >"$out" 2>&1 &
  local runner=$!
  local deadline=$(($(now_ns) + 60000000000)) pids=()
  while ((${#pids[@]} < n)) && (($(now_ns) < deadline)) && kill -0 $runner 2>/dev/null; do
    mapfile -t pids < <(pids_of "$out")
    sleep 0.02
  done
  local victim=$((RANDOM % n)) delay_ms=$((200 + RANDOM % 1800))
  local name="kill $t #$i: rank $victim after ${delay_ms} ms (seed $kseed)"
  if ((${#pids[@]} < n)); then
    check "$name: every rank started" "$(cat "$out")" 1
    kill -9 $runner 2>/dev/null
    return
  fi
  local victim_pid job
  victim_pid=$(sed -nE "s/^\[[0-9]+\] rank $victim: pid ([0-9]+)$/\1/p" "$out")
  job=$(job_of "$victim_pid")
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  local killed_at
  killed_at=$(now_ns)
  kill -9 "$victim_pid"
  wait $runner
  local status=$?
  local done_at
  done_at=$(now_ns)
  sed 's/^/    /' "$out" | grep -vE "rank [0-9]+: pid "
  # Each survivor: "rank R: failed code=C at_ns=T: MESSAGE".
  local reports=0 named=0 worst_ms=0 line code at ms
  while IFS= read -r line; do
    reports=$((reports + 1))
    code=$(sed -nE 's/.*failed code=([a-z_]+) .*/\1/p' <<<"$line")
    at=$(sed -nE 's/.* at_ns=([0-9]+):.*/\1/p' <<<"$line")
    if [[ $code == peer_failure && $line =~ rank\ $victim[^0-9:] ]] || [[ $code == aborted ]]; then
      named=$((named + 1))
    fi
    ms=$(((at - killed_at) / 1000000))
    ((ms > worst_ms)) && worst_ms=$ms
  done < <(grep -E "rank [0-9]+: failed code=" "$out")
  local survivors=$((n - 1)) bound=$((kill_timeout_ms + kill_slack_ms))
  check "$name: $survivors survivors report the failure" "$reports reports" $(ok_if test $reports -eq $survivors)
  check "$name: each names rank $victim (peer_failure) or was aborted" "$named of $reports" \
    $(ok_if test $named -eq $survivors)
  check "$name: all detected within ${bound} ms (slowest ${worst_ms} ms)" "too slow" $(ok_if test $worst_ms -le $bound)
  local codes
  codes=$(grep -oE "failed code=[a-z_]+" "$out" | sed 's/failed code=//' | sort | uniq -c | awk '{printf "%s%s x%d", sep, $2, $1; sep=", "}')
  echo "figure kill $t #$i: rank $victim of $n killed (SIGKILL) ${delay_ms} ms after all started; survivors reported" \
    "[$codes] within ${worst_ms} ms (timeout ${kill_timeout_ms} ms); tutti-run exited $status" \
    "$(((done_at - killed_at) / 1000000)) ms after the kill"
  check "$name: tutti-run exits non-zero" "status $status" $(ok_if test $status -ne 0)
  check "$name: tutti-run names the killed rank" "$(grep -v 'rank [0-9]*: ' "$out")" \
    $(ok_if grep -q "rank $victim (pid $victim_pid) killed by signal 9" "$out")
  sleep 0.2
  check_clean "$name" "$job" "$tmp" "${pids[@]}"
}

echo "soak: p=$n transports=[$transports] small=$small large=$large kills=$kills seed=$seed"
for t in $transports; do
  clean_run "$t"
  for ((i = 1; i <= kills; ++i)); do kill_run "$t" "$i"; done
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
