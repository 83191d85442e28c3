#!/usr/bin/env bash
# The tests: installs what it needs, builds with warnings as errors, checks formatting, runs every
# ctest (package.install: an installed Tutti through find_package and pkg-config), then the sanitizer
# builds (scripts/sanitize.sh asan, tsan) and the fuzz targets (scripts/fuzz.sh). Each of the
# last three can be skipped for a quick local run: TUTTI_CI_ASAN=0, TUTTI_CI_TSAN=0,
# TUTTI_CI_FUZZ=0 (TUTTI_CI_SANITIZE=0 skips both sanitizers). Arguments go to the first ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/jobs.sh
begin=$(date +%s)
bash scripts/deps.sh
# PyPI's torch for python.torch2 (its venv, build/torch2-check/venv), fetched while the build
# compiles: a download, not compute; the test waits for it if it has not ended by then.
mkdir -p build/torch2-check
nice -n 10 bash scripts/torch2_check.sh --work build/torch2-check --venv-only >build/torch2-check/prefetch.log 2>&1 </dev/null &
bash scripts/build.sh

echo "== clang-format"
git ls-files -- '*.cpp' '*.hpp' | xargs clang-format --dry-run -Werror

# PyTorch's own distributed tests (python.c10d.torch_subset) import expecttest, which Debian does not
# package: from PyPI into build/pydeps. Without the network the test says so and is skipped.
if [[ -d build/python ]] && ! PYTHONPATH=build/pydeps /usr/bin/python3 -c "import expecttest" 2>/dev/null; then
  /usr/bin/python3 -m pip install --quiet --target build/pydeps expecttest ||
    echo "tutti: could not install expecttest from PyPI: python.c10d.torch_subset will be skipped"
fi

# The sanitizer and fuzz trees, each only if its stage runs: built on idle cores while the tests
# run (idle_build_start in scripts/jobs.sh); each stage stops that, builds what is left of its own
# tree, and hands the idle cores to the next trees while its tests run.
enabled() { [[ ${!1:-1} != 0 && ! ($1 == TUTTI_CI_[AT]SAN && ${TUTTI_CI_SANITIZE:-1} == 0) ]]; }
trees=()
enabled TUTTI_CI_ASAN && trees+=(asan)
enabled TUTTI_CI_TSAN && trees+=(tsan)
enabled TUTTI_CI_FUZZ && trees+=(fuzz)
trap idle_build_stop EXIT
idle_build_start "${trees[@]}"

echo "== ctest"
ctest_start=$(date +%s)
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@") | tee build/ctest.log
ctest_summary=$(grep -E 'tests passed|tests failed' build/ctest.log | tail -n 1)
summary=("ctest: $ctest_summary (build and ctest $((ctest_start - begin)) + $(($(date +%s) - ctest_start)) s)")
passed=1 failed=0

# stage NAME SKIP-VARIABLE COMMAND...: runs one stage unless SKIP-VARIABLE=0, keeps its last line.
stage() {
  local name=$1 variable=$2 start status=0
  shift 2
  if ! enabled "$variable"; then
    summary+=("$name: skipped ($variable=0)")
    return
  fi
  echo "== $name"
  start=$(date +%s)
  "$@" 2>&1 | tee "build/$name.log" || status=$?
  local last
  last=$(grep -E '^(sanitize|fuzz)' "build/$name.log" | tail -n 1 || true)
  if ((status == 0)); then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  summary+=("$name: $([[ $status -eq 0 ]] && echo ok || echo FAILED) ($(($(date +%s) - start)) s) ${last}")
}
# sanitizer TREE: the rest of TREE's build in the foreground, then its tests while the trees after
# it build on idle cores.
sanitizer() {
  local tree=$1 status=0
  idle_build_stop
  bash scripts/sanitize.sh "$tree" --build || return 1
  local later=("${trees[@]}")
  while ((${#later[@]})) && [[ ${later[0]} != "$tree" ]]; do later=("${later[@]:1}"); done
  idle_build_start "${later[@]:1}"
  bash scripts/sanitize.sh "$tree" --test || status=$?
  return "$status"
}
stage asan TUTTI_CI_ASAN sanitizer asan
stage tsan TUTTI_CI_TSAN sanitizer tsan
idle_build_stop
# 10 s a fuzz target here (7 targets, two at a time: 40 s; their corpora also run as ctests);
# FUZZ_SECONDS=600 bash scripts/fuzz.sh fuzzes longer.
stage fuzz TUTTI_CI_FUZZ env FUZZ_SECONDS="${FUZZ_SECONDS:-10}" bash scripts/fuzz.sh

echo "== summary ($(($(date +%s) - begin)) s in all)"
printf '%s\n' "${summary[@]}"
# The closing line counts ctest's tests and the later stages, each stage as one.
ctest_total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' build/ctest.log | tail -n 1)
ctest_failed=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed.*/\1/p' build/ctest.log | tail -n 1)
ctest_total=${ctest_total:-0} ctest_failed=${ctest_failed:-0}
echo "$((ctest_total - ctest_failed + passed - 1)) passed, $((ctest_failed + failed)) failed"
((failed == 0 && ctest_failed == 0))
