#!/usr/bin/env bash
# torch_subset.sh BUILD_DIR: the tests of PyTorch's DistributedTest named in torch_subset.txt,
# against "tutti", at WORLD_SIZE 3; fails when one fails. The ranks are forked from the test's
# process, not spawned as PyTorch's harness does (scripts/torch_dist_tests.sh spawns): a spawned
# rank imports torch anew, seconds per rank, which made this test 4 minutes instead of half of one.
# PyTorch's test utilities import expecttest, which Debian does not package: without it in
# BUILD_DIR/pydeps (scripts/torch_dist_tests.sh installs it there) or on the path, the test says so
# and is skipped (77). PYTHON (default /usr/bin/python3) is the interpreter: a venv's, with torch 2.x,
# for a build made against that torch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$1
python=${PYTHON:-/usr/bin/python3}
export PYTHONPATH=$build/python:$build/pydeps${PYTHONPATH:+:$PYTHONPATH}
if ! "$python" -c "import expecttest" 2>/dev/null; then
  echo "torch_subset: expecttest is not installed (run scripts/torch_dist_tests.sh once, or" \
       "pip install --target $build/pydeps expecttest): skipped" >&2
  exit 77
fi
export BACKEND=tutti WORLD_SIZE=3 DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=60
summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
status=0
"$python" "$here/torch_distributed_test.py" --fork --tests "$here/torch_subset.txt" --summary "$summary" || status=1
# Every named test must have run and passed: a skip here would hide a test that stopped applying.
# Two exceptions, named in the count, both torch 2.x's skips for every backend: its subgroup tests
# run only at WORLD_SIZE 8 or more ("Skipped due to small world size."; torch 1.13 runs them at 3),
# too many ranks for this test; and tests it marks as failing ("Test is failing, see ...").
"$python" - "$summary" "$here/torch_subset.txt" <<'PY' || status=1
import json, sys
run = json.load(open(sys.argv[1]))
names = [l.split("#")[0].strip() for l in open(sys.argv[2]) if l.split("#")[0].strip()]
small = [n for n in names if run["skipped"].get(n, "").startswith(("Skipped due to small world size", "Test is failing"))]
missing = [n for n in names if n not in run["passed"] and n not in small]
print(f"torch_subset: {len(names) - len(missing) - len(small)} of {len(names)} passed"
      + (f", {len(small)} skipped by torch for every backend: {small}" if small else "")
      + (f"; not passed: {missing}" if missing else ""))
sys.exit(1 if missing else 0)
PY
exit $status
