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
