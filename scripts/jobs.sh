# Sourced by scripts that run independent jobs side by side (fuzz.sh, sanitize.sh, test.sh).
# run_parallel FUNCTION ITEM...: calls FUNCTION ITEM for each item in the background, as many at
# once as there are cores, starting them in the order given, and returns once all have ended.
# FUNCTION records its own outcome (its exit status is not collected).
run_parallel() {
  local function=$1 item running=0 cores
  shift
  cores=$(nproc)
  for item in "$@"; do
    "$function" "$item" &
    running=$((running + 1))
    if ((running >= cores)); then
      wait -n || true
      running=$((running - 1))
    fi
  done
  wait
}

# build_quietly NAME DIR [cmake --build arguments...]: builds DIR, printing only ninja's last line;
# if the build fails, prints the failing commands' errors and "NAME: the build failed" (a line the
# stage summaries of scripts/test.sh pick up), and returns 1.
build_quietly() {
  local name=$1 dir=$2
  shift 2
  if cmake --build "$dir" -j "$(nproc)" "$@" >"$dir/build.log" 2>&1; then
    tail -n 1 "$dir/build.log"
    return 0
  fi
  grep -E -A8 "^FAILED|error:" "$dir/build.log" | head -n 80
  echo "$name: the build failed (all of its output: $dir/build.log)"
  return 1
}

# Builds on idle cores (scripts/test.sh). A stage that runs tests leaves part of the cores idle
# (ranks waiting on each other, timeouts, downloads): the trees of the later stages build meanwhile
# at the lowest priority (SCHED_IDLE and nice 19: a core runs them only when nothing else wants
# it), so that their compile time overlaps the tests instead of following them.
#   idle_build_start TREE...  builds each tree in turn in the background (asan and tsan through
#                             scripts/sanitize.sh TREE --build, fuzz through scripts/fuzz.sh
#                             --build), its output in build/idle-build-TREE.log
#   idle_build_stop           stops it (ninja removes what it cut short), so that the stage that
#                             needs a tree builds the rest of it in the foreground
# The builder is its own process group (job control, not a new session, which would give it a
# scheduling group of its own), recorded in build/idle-build.pid.
idle_build_start() {
  (($#)) || return 0
  idle_build_stop
  local scheduler=(nice -n 19)
  chrt --idle 0 true 2>/dev/null && scheduler=(chrt --idle 0 nice -n 19)
  set -m
  "${scheduler[@]}" bash -c '
    for tree; do
      case $tree in
        fuzz) command=(bash scripts/fuzz.sh --build) ;;
        *) command=(bash scripts/sanitize.sh "$tree" --build) ;;
      esac
      "${command[@]}" >"build/idle-build-$tree.log" 2>&1 || exit 0
    done' idle-build "$@" </dev/null &
  echo $! >build/idle-build.pid
  set +m
}

idle_build_stop() {
  [[ -f build/idle-build.pid ]] || return 0
  local pid
  pid=$(cat build/idle-build.pid)
  rm -f build/idle-build.pid
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  # Not necessarily a child of this shell (a stage runs in a pipeline's subshell): poll.
  for _ in $(seq 600); do
    kill -0 -- "-$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
}
