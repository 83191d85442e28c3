#!/usr/bin/env bash
# Tutti as a subproject: a parent project that adds it with add_subdirectory and links
# Tutti::tutti configures, and gets the library alone: none of Tutti's tests, tools,
# micro-benchmarks or Python modules (TUTTI_BUILD_TESTS and the others default to off there).
#   subproject_test.sh SOURCE_DIR
set -euo pipefail
source=$1
work=$(mktemp -d /tmp/tutti-subproject-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/parent"
cat >"$work/parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(parent CXX)
enable_testing()
add_subdirectory("$source" tutti)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE Tutti::tutti)
CMAKE
printf '#include <tutti/tutti.hpp>\nint main() { return tutti::version() == nullptr; }\n' >"$work/parent/main.cpp"
if ! cmake -S "$work/parent" -B "$work/build" -G Ninja >"$work/configure.log" 2>&1; then
  cat "$work/configure.log"
  echo "subproject_test: the parent project does not configure"
  exit 1
fi
status=0
for option in TUTTI_BUILD_TESTS TUTTI_BUILD_TOOLS TUTTI_BUILD_BENCHMARKS TUTTI_PYTHON; do
  value=$(sed -n "s/^$option:BOOL=//p" "$work/build/CMakeCache.txt")
  [[ $value == OFF ]] || { echo "subproject_test: $option is '$value', not OFF"; status=1; }
done
tests=$(cd "$work/build" && ctest -N | sed -n 's/^Total Tests: //p')
[[ $tests == 0 ]] || { echo "subproject_test: the parent has $tests tests of Tutti's"; status=1; }
targets=$(ninja -C "$work/build" -t targets all)
grep -q 'libtutti\.a\|libtutti\.so' <<<"$targets" || { echo "subproject_test: no libtutti target"; status=1; }
extra=$(grep -oE '^tutti/(tests|tools|bench|python)/[^:]*' <<<"$targets" | head -n 5 || true)
[[ -z $extra ]] || { echo "subproject_test: targets beyond the library:" $extra; status=1; }
((status == 0)) && echo "subproject_test: add_subdirectory(tutti) configures the library alone"
exit "$status"
