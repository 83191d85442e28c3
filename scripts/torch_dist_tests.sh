#!/usr/bin/env bash
# PyTorch's own DistributedTest (torch/testing/_internal/distributed/distributed_test.py, shipped
# with python3-torch) against the torch.distributed backend "tutti" and, in the same run, against
# "gloo": the same tests, the same world size, one after the other; prints both counts
# (docs/torch-distributed.md).
#
#   scripts/torch_dist_tests.sh [BUILD_DIR] [driver options: --tests FILE, -k PATTERN]
#
# BUILD_DIR (default build) must have the targets _c10d and _tutti built. PYTHON (default
# /usr/bin/python3, Debian's torch 1.13) is the interpreter: a venv's, with torch 2.x and the
# package pip-installed in it (docs/python.md), runs torch 2.x's DistributedTest (its wheel ships
# the test file too); BUILD_DIR then only holds the logs and expecttest. WORLD_SIZE (default 3,
# as PyTorch's CI runs Gloo) and DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (seconds per test, default
# 120) are read from the environment. Logs and per-backend JSON summaries go to
# BUILD_DIR/torch-dist-tests/. expecttest, which PyTorch's test utilities import and Debian does
# not package, is installed from PyPI into BUILD_DIR/pydeps when missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
shift $(( $# > 0 ? 1 : 0 ))
python=${PYTHON:-/usr/bin/python3}
pydeps=$build/pydeps
out=$build/torch-dist-tests
mkdir -p "$out"
if ! PYTHONPATH=$pydeps $python -c "import expecttest" 2>/dev/null; then
  $python -m pip install --quiet --target "$pydeps" expecttest
fi
export PYTHONPATH=$build/python:$pydeps PYTHONDONTWRITEBYTECODE=1
export WORLD_SIZE=${WORLD_SIZE:-3} DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=${DISTRIBUTED_TESTS_DEFAULT_TIMEOUT:-120}
status=0
for backend in tutti gloo; do
  start=$(date +%s)
  BACKEND=$backend $python "$root/tests/python/c10d/torch_distributed_test.py" --summary "$out/$backend.json" "$@" \
    >"$out/$backend.log" 2>&1 || status=1
  echo "$backend: $(tail -n 1 "$out/$backend.log") in $(( $(date +%s) - start )) s (log: $out/$backend.log)"
done
# Side by side: the tests whose outcome differs between the two backends.
$python - "$out/tutti.json" "$out/gloo.json" <<'PY'
import json, sys
runs = [json.load(open(path)) for path in sys.argv[1:]]
def outcome(run, name):
    return "passed" if name in run["passed"] else "failed" if name in run["failed"] else "skipped"
names = sorted(set().union(*(set(r["passed"]) | set(r["failed"]) | set(r["skipped"]) for r in runs)))
for r in runs:
    print(f"{r['backend']:>6}: {len(r['passed'])} passed, {len(r['failed'])} failed, {len(r['skipped'])} skipped")
differ = [(n, outcome(runs[0], n), outcome(runs[1], n)) for n in names if outcome(runs[0], n) != outcome(runs[1], n)]
print(f"{len(differ)} tests differ (tutti / gloo):")
for n, a, b in differ:
    reason = runs[0]["skipped"].get(n, "") if a == "skipped" else ""
    print(f"  {n}: {a} / {b}" + (f"  [{reason[:100]}]" if reason else ""))
PY
exit $status
