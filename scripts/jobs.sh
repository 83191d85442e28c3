# Sourced by scripts that run independent jobs side by side (fuzz.sh, sanitize.sh).
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
