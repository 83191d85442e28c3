#!/usr/bin/env bash
# Fuzzing: builds the fuzz targets (preset fuzz: clang, libFuzzer, ASan+UBSan, in build-fuzz/) and
# runs each for FUZZ_SECONDS (default 30: on 2 cores, 7 targets take 4 rounds, 2 minutes)
# from its checked-in seed corpus tests/fuzz/corpus/<name>/, as many at once as there are cores.
# Prints the executions and findings of each target and fails if any found something: the
# reproducer is then copied into the target's corpus folder, where it stays as a regression input
# (ctest replays every corpus file, label unit) once it is fixed.
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh            longer
#   FUZZ_TARGETS="env store_frame" bash scripts/fuzz.sh  some of them
#   bash scripts/fuzz.sh --build                     only builds them (scripts/test.sh, on idle cores)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/jobs.sh
seconds=${FUZZ_SECONDS:-30}
read -r -a targets <<<"${FUZZ_TARGETS:-store_frame handshake tuning_json env tcp_frame shm_header checkpoint}"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

cmake --preset fuzz "${launcher[@]}" >/dev/null
build_quietly fuzz build-fuzz --target "${targets[@]/#/fuzz_}" || exit 1
[[ ${1:-} == --build ]] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fuzz_one() {
  local name=$1 status=0
  mkdir -p "$work/$name/new"
  # New inputs go to a scratch folder (the first one named), so the checked-in seeds stay small
  # and hand-made; the seeds are read from the second.
  build-fuzz/tests/fuzz/fuzz_"$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$work/$name/" "$work/$name/new" "tests/fuzz/corpus/$name" \
    >"$work/$name/log" 2>&1 || status=$?
  echo "$status" >"$work/$name/status"
}

run_parallel fuzz_one "${targets[@]}"

failed=0
for name in "${targets[@]}"; do
  dir="$work/$name"
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -n 1)
  coverage=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -n 1 | cut -d' ' -f2)
  findings=()
  for artifact in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* "$dir"/slow-unit-*; do
    [[ -e $artifact ]] && findings+=("$artifact")
  done
  status=$(cat "$dir/status")
  printf 'fuzz %-12s %10s executions in %ss, coverage %s, %d findings (exit %s)\n' "$name" "${executions:-?}" \
    "$seconds" "${coverage:-?}" "${#findings[@]}" "$status"
  if ((status != 0 || ${#findings[@]} > 0)); then
    failed=1
    tail -n 60 "$dir/log"
    for artifact in "${findings[@]}"; do
      cp "$artifact" "tests/fuzz/corpus/$name/"
      echo "fuzz $name: reproducer kept as tests/fuzz/corpus/$name/$(basename "$artifact")"
    done
  fi
done
if ((failed)); then
  echo "fuzz: FAILED (reproduce with build-fuzz/tests/fuzz/fuzz_<name> <file>)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${seconds}s each, no findings"
