#!/usr/bin/env bash
# tutti-run, end to end: output tagging, the ranks' environment, exit statuses, failures and the
# grace period, signal forwarding, clean-up of processes, store directory and /dev/shm, usage.
# Every run is bounded by `timeout`; every process and file a case makes is removed at the end.
#
#   tutti_run_test.sh PATH/TO/tutti-run
# The ranks' scripts are single-quoted on purpose: they expand in the ranks, not here.
# shellcheck disable=SC2016
set -u
run=$1
passed=0
failed=0
tmp=$(mktemp -d)
# A unique word on the command line of every process the cases start, for pgrep -f.
marker="tutti-run-test-$$-$RANDOM"
# A sleep whose command line carries the marker, so leftover sleeps are found too.
sleep_bin="$tmp/sleep-$marker"
ln -s "$(command -v sleep)" "$sleep_bin"

cleanup() {
  pkill -KILL -f "$marker" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() {
  echo "FAIL $1: $2"
  for f in "$tmp/out" "$tmp/err"; do [[ -s $f ]] && sed 's/^/    | /' "$f"; done
  failed=$((failed + 1))
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# Runs tutti-run with a 30 s bound; output in $tmp/out and $tmp/err, status in $status.
tr_run() {
  timeout -s KILL 30 "$run" "$@" >"$tmp/out" 2>"$tmp/err"
  status=$?
}
# True if no process of this test is left; kills the leftovers otherwise, so that the later
# cases do not fail for this one.
no_leftovers() {
  pgrep -f "$marker" >/dev/null || return 0
  pgrep -af "$marker" >"$tmp/left"
  pkill -KILL -f "$marker"
  return 1
}

case_tagging() {
  tr_run -n 3 bash -c 'echo "first $TUTTI_RANK"; echo "to stderr $TUTTI_RANK" >&2; echo second; printf "partial"' "$marker"
  [[ $status -eq 0 ]] || { fail tagging "exit status $status"; return; }
  for r in 0 1 2; do
    local want got
    want=$(printf '[%s] first %s\n[%s] second\n[%s] partial' "$r" "$r" "$r" "$r")
    got=$(grep -F "[$r] " "$tmp/out")
    [[ $got == "$want" ]] || { fail tagging "rank $r stdout is '$got'"; return; }
    grep -qxF "[$r] to stderr $r" "$tmp/err" || { fail tagging "rank $r stderr line missing"; return; }
  done
  [[ $(wc -l <"$tmp/out") -eq 9 ]] || { fail tagging "expected 9 lines on stdout"; return; }
  tr_run --no-tag-output -n 2 bash -c 'echo plain; printf tail' "$marker"
  [[ $status -eq 0 && $(grep -cx plain "$tmp/out") -eq 2 && $(grep -cx tail "$tmp/out") -eq 2 ]] ||
    { fail tagging "--no-tag-output: status $status"; return; }
  ok tagging
}

case_no_interleaving() {
  # Four ranks write lines longer than PIPE_BUF as fast as they can: every line must come out
  # whole, although the pipes deliver them in pieces.
  local line
  line=$(printf 'x%.0s' {1..10000})
  tr_run -n 4 bash -c 'for i in $(seq 300); do echo "$1"; done' "$marker" "$line"
  local bad
  bad=$(awk '!/^\[[0-3]\] x+$/ || length($0) != 10004 { bad++ } END { print bad + 0 }' "$tmp/out")
  [[ $status -eq 0 && $bad -eq 0 && $(wc -l <"$tmp/out") -eq 1200 ]] ||
    { fail no-interleaving "status $status, $bad malformed lines, $(wc -l <"$tmp/out") lines; stderr: $(head -c 600 "$tmp/err")"; : >"$tmp/out"; return; }
  ok no-interleaving
}

case_environment() {
  tr_run -n 3 env -u TUTTI_TRANSPORT -u TUTTI_TIMEOUT_MS bash -c \
    'd=${TUTTI_STORE#file://}; echo "$TUTTI_RANK $TUTTI_SIZE $TUTTI_LOCAL_RANK $TUTTI_LOCAL_SIZE $TUTTI_JOB_ID $TUTTI_TOKEN $TUTTI_STORE $(stat -c %a "$d") ${TUTTI_TRANSPORT-unset} ${TUTTI_TIMEOUT_MS-unset}"' "$marker"
  [[ $status -eq 0 ]] || { fail environment "exit status $status"; return; }
  local ranks ids tokens stores
  ranks=$(sed 's/^\[[0-9]*\] //' "$tmp/out" | awk '{print $1, $2, $3, $4}' | sort | tr '\n' ,)
  [[ $ranks == "0 3 0 3,1 3 1 3,2 3 2 3," ]] || { fail environment "rank/size variables: $ranks"; return; }
  ids=$(awk '{print $6}' "$tmp/out" | sort -u)
  tokens=$(awk '{print $7}' "$tmp/out" | sort -u)
  stores=$(awk '{print $8, $9, $10, $11}' "$tmp/out" | sort -u)
  [[ $ids =~ ^[0-9a-f]{16}$ ]] || { fail environment "job ids: $ids"; return; }
  [[ $tokens =~ ^[0-9a-f]{64}$ ]] || { fail environment "tokens: $tokens"; return; }
  [[ $stores =~ ^file:///.*/tutti-$ids\ 700\ unset\ unset$ ]] || { fail environment "store: $stores"; return; }
  local dir=${stores#file://}
  dir=${dir%% *}
  [[ ! -e $dir ]] || { fail environment "store directory $dir left behind"; return; }
  local first_token=$tokens
  mkdir "$tmp/tmpdir"
  TMPDIR=$tmp/tmpdir tr_run -n 1 bash -c 'echo "$TUTTI_STORE"'
  [[ $(cat "$tmp/out") == "[0] file://$tmp/tmpdir/tutti-"* ]] || { fail environment "TMPDIR not used"; return; }
  [[ -z $(ls -A "$tmp/tmpdir") ]] || { fail environment "store directory left in TMPDIR"; return; }
  tr_run -n 1 --transport tcp --timeout-ms 1234 bash -c 'echo "$TUTTI_TRANSPORT $TUTTI_TIMEOUT_MS $TUTTI_TOKEN"'
  [[ $(cat "$tmp/out") =~ ^\[0\]\ tcp\ 1234\ [0-9a-f]{64}$ ]] || { fail environment "--transport/--timeout-ms"; return; }
  [[ $(awk '{print $4}' "$tmp/out") != "$first_token" ]] || { fail environment "token reused across jobs"; return; }
  ok environment
}

case_exit_status() {
  tr_run -n 3 bash -c 'if [ "$TUTTI_RANK" = 1 ]; then exit 3; fi; exit 0' "$marker"
  [[ $status -eq 3 ]] || { fail exit-status "expected 3, got $status"; return; }
  grep -qE '^tutti-run: rank 1 \(pid [0-9]+\) exited with status 3$' "$tmp/err" ||
    { fail exit-status "no report of rank 1"; return; }
  tr_run -n 4 true
  [[ $status -eq 0 ]] || { fail exit-status "all zero: got $status"; return; }
  ok exit-status
}

case_killed_rank() {
  # Rank 0 kills itself; the others sleep far longer than the grace period.
  local start elapsed
  start=$(now_ms)
  tr_run -n 3 --grace-period 1 bash -c 'if [ "$TUTTI_RANK" = 0 ]; then kill -9 $$; fi; "$1" 25; echo woke' "$marker" "$sleep_bin"
  elapsed=$(($(now_ms) - start))
  [[ $status -eq 137 ]] || { fail killed-rank "expected 137, got $status"; return; }
  ((elapsed < 10000)) || { fail killed-rank "took $elapsed ms: the sleeping ranks kept the job alive"; return; }
  grep -qE 'rank 0 \(pid [0-9]+\) killed by signal 9 \(Killed\)' "$tmp/err" || { fail killed-rank "no report"; return; }
  grep -q 'killing (SIGKILL) the 2 ranks still running' "$tmp/err" || { fail killed-rank "no kill notice"; return; }
  no_leftovers || { fail killed-rank "processes left: $(cat "$tmp/left")"; return; }
  ok killed-rank
}

# Starts tutti-run in the background (bounded by timeout) and sets $tr_pid to tutti-run's pid once
# `want` lines matching `ready` have appeared in $tmp/out.
start_background() {
  local want=$1 ready=$2
  shift 2
  timeout -s KILL 30 "$run" "$@" >"$tmp/out" 2>"$tmp/err" &
  timeout_pid=$!
  for _ in $(seq 100); do
    [[ $(grep -c "$ready" "$tmp/out") -ge $want ]] && break
    sleep 0.1
  done
  tr_pid=$(pgrep -P "$timeout_pid" -x tutti-run)
}

case_sigterm_forwarded() {
  local script='trap "echo got TERM; exit 0" TERM; echo ready; "$1" 25 & wait'
  start_background 2 ready -n 2 bash -c "$script" "$marker" "$sleep_bin"
  [[ -n $tr_pid ]] || { fail sigterm-forwarded "tutti-run did not start"; wait; return; }
  kill -TERM "$tr_pid"
  wait "$timeout_pid"
  status=$?
  [[ $(grep -c '^\[[01]\] got TERM$' "$tmp/out") -eq 2 ]] || { fail sigterm-forwarded "ranks did not get SIGTERM"; return; }
  [[ $status -eq 143 ]] || { fail sigterm-forwarded "expected 143, got $status"; return; }
  no_leftovers || { fail sigterm-forwarded "processes left: $(cat "$tmp/left")"; return; }
  ok sigterm-forwarded
}

case_second_signal_kills() {
  # The ranks ignore SIGTERM (they only print): the second one must kill them.
  local script='trap "echo got TERM" TERM; echo ready; while true; do "$1" 25 & wait; done'
  start_background 2 ready -n 2 bash -c "$script" "$marker" "$sleep_bin"
  [[ -n $tr_pid ]] || { fail second-signal "tutti-run did not start"; wait; return; }
  kill -TERM "$tr_pid"
  for _ in $(seq 100); do
    [[ $(grep -c 'got TERM' "$tmp/out") -ge 2 ]] && break
    sleep 0.1
  done
  kill -TERM "$tr_pid"
  wait "$timeout_pid"
  status=$?
  [[ $status -eq 137 ]] || { fail second-signal "expected 137, got $status"; return; }
  grep -q 'again; killing' "$tmp/err" || { fail second-signal "no notice of the escalation"; return; }
  no_leftovers || { fail second-signal "processes left: $(cat "$tmp/left")"; return; }
  ok second-signal
}

# tutti-run killed by `sig` while each rank (a wrapper script) waits for a child of its own: within
# a few seconds no rank, grandchild or helper of the job may be left, nor its store directory or
# /dev/shm entry. SIGKILL leaves tutti-run no chance to clean up itself; then rank 1's child also
# ignores SIGTERM, so only SIGKILL ends it.
launcher_killed() {
  local sig=$1 script='d=${TUTTI_STORE#file://}; touch "/dev/shm/tutti-$TUTTI_JOB_ID-x"
    if [ "$TUTTI_RANK" = 1 ] && [ "$3" = KILL ]; then trap "" TERM; fi
    "$1" 300 & echo "$TUTTI_JOB_ID $d $!" >"$2/child.$TUTTI_RANK"; echo ready; wait'
  rm -f "$tmp"/child.*
  start_background 2 ready -n 2 bash -c "$script" "$marker" "$sleep_bin" "$tmp" "$sig"
  [[ -n $tr_pid ]] || { fail "launcher-$sig" "tutti-run did not start"; wait; return; }
  local id dir
  read -r id dir _ <"$tmp/child.0"
  kill "-$sig" "$tr_pid"
  { wait "$timeout_pid"; } 2>/dev/null  # no "Killed" notice from bash
  status=$?
  local start left
  start=$(now_ms)
  while left=$(pgrep -af "$marker") || [[ -e $dir || -e /dev/shm/tutti-$id-x ]]; do
    (($(now_ms) - start < 8000)) || break
    sleep 0.1
  done
  local files=""
  [[ -e $dir ]] && files="$dir"
  [[ -e /dev/shm/tutti-$id-x ]] && files="$files /dev/shm/tutti-$id-x"
  rm -rf "$dir" "/dev/shm/tutti-$id-x"
  [[ -n $id ]] || { fail "launcher-$sig" "rank 0 did not report its files"; return; }
  if [[ -n $left || -n $files ]]; then
    pkill -KILL -f "$marker"
    fail "launcher-$sig" "8 s after SIG$sig, left behind: ${files:-no files}; ${left:-no processes}"
    return
  fi
  [[ $status -eq $((128 + $(kill -l "$sig"))) ]] || { fail "launcher-$sig" "exit status $status"; return; }
  [[ $sig != KILL ]] || grep -q "ended without cleaning up" "$tmp/err" || { fail launcher-KILL "no report"; return; }
  ok "launcher-$sig (gone in $(($(now_ms) - start)) ms)"
}

case_launcher_killed() {
  local sig
  for sig in KILL TERM INT; do
    : >"$tmp/out"
    : >"$tmp/err"
    launcher_killed "$sig"
  done
}

case_cleanup_after_crash() {
  local script='if [ "$TUTTI_RANK" = 0 ]; then
      touch "/dev/shm/tutti-$TUTTI_JOB_ID-x"; echo value >"${TUTTI_STORE#file://}/key"
      echo "made $TUTTI_JOB_ID ${TUTTI_STORE#file://}"; "$1" 25 & ulimit -c 0; kill -SEGV $$
    fi
    "$1" 25'
  tr_run -n 3 --grace-period 1 bash -c "$script" "$marker" "$sleep_bin"
  [[ $status -eq 139 ]] || { fail cleanup "expected 139, got $status"; return; }
  local id dir
  read -r id dir < <(sed -n 's/^\[0\] made //p' "$tmp/out")
  [[ -n $id && -n $dir ]] || { fail cleanup "rank 0 did not report its files"; return; }
  [[ ! -e /dev/shm/tutti-$id-x ]] || { rm -f "/dev/shm/tutti-$id-x"; fail cleanup "/dev/shm entry left"; return; }
  [[ ! -e $dir ]] || { rm -rf "$dir"; fail cleanup "store directory left"; return; }
  no_leftovers || { fail cleanup "processes left: $(cat "$tmp/left")"; return; }
  ok cleanup
}

case_broken_pipe() {
  # Nobody reads the output after 3 lines: the ranks must see the broken pipe and the job end.
  timeout -s KILL 30 "$run" -n 2 bash -c 'while echo y; do :; done' "$marker" 2>"$tmp/err" | head -n 3 >"$tmp/out"
  status=${PIPESTATUS[0]}
  [[ $status -eq 141 ]] || { fail broken-pipe "expected 141 (SIGPIPE), got $status"; return; }
  [[ $(wc -l <"$tmp/out") -eq 3 ]] || { fail broken-pipe "head did not get 3 lines"; return; }
  no_leftovers || { fail broken-pipe "processes left: $(cat "$tmp/left")"; return; }
  ok broken-pipe
}

case_usage() {
  local args
  for args in "" "-n" "-n 0" "-n 1025" "-n two true" "--bogus -n 1 true" "-n 2" "-n 2 --transport ib true" \
    "-n 2 --timeout-ms -5 true" "-n 2 --grace-period soon true"; do
    # shellcheck disable=SC2086  # word splitting of $args is the point
    tr_run $args
    [[ $status -eq 2 ]] || { fail usage "'tutti-run $args' exited $status"; return; }
    grep -q '^usage: tutti-run' "$tmp/err" || { fail usage "'tutti-run $args' printed no usage"; return; }
  done
  tr_run --help
  [[ $status -eq 0 ]] || { fail usage "--help exited $status"; return; }
  for word in TUTTI_TOKEN TUTTI_STORE TUTTI_JOB_ID --grace-period --no-tag-output mpirun srun; do
    grep -q -e "$word" "$tmp/out" || { fail usage "--help does not mention $word"; return; }
  done
  ok usage
}

# What users of mpirun type: -np N, -x NAME=VALUE (set for every rank), -x NAME (passed), and
# "--" before the program; -x of a variable tutti-run sets, or of a malformed name, is refused.
case_mpirun_spellings() {
  FROM_OUTSIDE=kept tr_run -np 2 -x CHOSEN=inner -x FROM_OUTSIDE -x EMPTY= -- \
    bash -c 'echo "$TUTTI_SIZE $CHOSEN $FROM_OUTSIDE ${EMPTY-unset}."' "$marker"
  [[ $status -eq 0 && $(grep -cxF -e "[0] 2 inner kept ." -e "[1] 2 inner kept ." "$tmp/out") -eq 2 ]] ||
    { fail mpirun-spellings "-np 2 -x ... --: status $status"; return; }
  CHOSEN=outer tr_run -np 1 -x CHOSEN=inner bash -c 'echo "$CHOSEN"'
  grep -qxF "[0] inner" "$tmp/out" || { fail mpirun-spellings "-x did not override the outer value"; return; }
  local args
  for args in "-x TUTTI_RANK=3" "-x TUTTI_STORE" "-x 1A=b" "-x =b" "-x"; do
    # shellcheck disable=SC2086  # word splitting of $args is the point
    tr_run -n 1 $args true
    [[ $status -eq 2 ]] || { fail mpirun-spellings "'tutti-run -n 1 $args true' exited $status"; return; }
  done
  ok mpirun-spellings
}

case_missing_program() {
  tr_run -n 2 "no-such-program-$marker"
  [[ $status -eq 127 ]] || { fail missing-program "expected 127, got $status"; return; }
  grep -q "cannot run 'no-such-program-$marker'" "$tmp/err" || { fail missing-program "message does not name it"; return; }
  touch "$tmp/not-executable"
  tr_run -n 2 "$tmp/not-executable"
  [[ $status -eq 127 ]] || { fail missing-program "non-executable: expected 127, got $status"; return; }
  # Found and executable, but execve fails (its interpreter is missing): found when rank 0 starts.
  printf '#!/nonexistent/%s\n' "$marker" >"$tmp/bad-interpreter"
  chmod +x "$tmp/bad-interpreter"
  tr_run -n 3 "$tmp/bad-interpreter"
  [[ $status -eq 127 ]] || { fail missing-program "bad interpreter: expected 127, got $status"; return; }
  grep -q "cannot run '$tmp/bad-interpreter'" "$tmp/err" || { fail missing-program "bad interpreter not named"; return; }
  no_leftovers || { fail missing-program "processes left"; return; }
  ok missing-program
}

for c in tagging no_interleaving environment exit_status killed_rank sigterm_forwarded second_signal_kills \
  cleanup_after_crash launcher_killed broken_pipe usage mpirun_spellings missing_program; do
  : >"$tmp/out"
  : >"$tmp/err"
  "case_$c"
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
