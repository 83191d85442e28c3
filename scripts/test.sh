#!/usr/bin/env bash
# The tests: installs what it needs, builds with warnings as errors, checks formatting, checks
# that an installed Tutti is usable through find_package, then runs every ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh

echo "== clang-format"
git ls-files -- '*.cpp' '*.hpp' | xargs clang-format --dry-run -Werror

echo "== install + find_package(Tutti) from another project"
prefix=$(mktemp -d)
consumer=$(mktemp -d)
trap 'rm -rf "$prefix" "$consumer"' EXIT
cmake --install build --prefix "$prefix" >/dev/null
cmake -S tests/consumer -B "$consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$consumer" >/dev/null
"$consumer/consumer"

echo "== ctest"
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
