# What the shell tests share; source it first:  source "$(dirname "$0")/../lib.sh" (from a folder of tests/)
#   $scratch   a private directory (mode 0700), removed at exit;
#   pids+=($!) every process the test starts in the background: killed at exit if still there;
#   at_exit 'COMMAND'  more cleanup, run at exit before $scratch goes (e.g. /dev/shm segments);
#   check NAME STATUS [DETAIL]  one case: "ok   NAME", or "FAIL NAME" with DETAIL indented below;
#   finish [NOTE]  the summary line; its status is the test's (0 when no case failed).
scratch=$(mktemp -d)
chmod 700 "$scratch"
pids=()
passed=0 failed=0
lib_exit_commands=()
at_exit() { lib_exit_commands+=("$1"); }
lib_cleanup() {
  local pid command
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for command in "${lib_exit_commands[@]}"; do eval "$command"; done
  rm -rf "$scratch"
}
trap lib_cleanup EXIT
check() {
  if [[ $2 -eq 0 ]]; then
    echo "ok   $1"
    passed=$((passed + 1))
  else
    echo "FAIL $1"
    [[ -n ${3:-} ]] && sed 's/^/  | /' <<<"$3"
    failed=$((failed + 1))
  fi
  return 0
}
finish() {
  echo "$passed passed, $failed failed${1:+, $1}"
  ((failed == 0))
}
