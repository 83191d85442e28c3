#!/usr/bin/env bash
# torch_subset.sh BUILD_DIR: the tests of PyTorch's DistributedTest named in torch_subset.txt,
# against "tutti", at WORLD_SIZE 3 (and at 8 those that torch 2.x runs only there); fails when one
# fails or is skipped. The ranks are forked from the test's
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
export BACKEND=tutti DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=60
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The list for this torch: a line "NAME torch<2" names a test that only torch 1.x runs.
major=$("$python" -c "import torch; print(torch.__version__.split('.')[0])")
awk -v major="$major" '{ sub(/#.*/, "") } NF == 1 || (NF == 2 && $2 == "torch<2" && major < 2) { print $1 }' \
  "$here/torch_subset.txt" >"$work/names"
status=0
WORLD_SIZE=3 "$python" "$here/torch_distributed_test.py" --fork --tests "$work/names" --summary "$work/ws3.json" || status=1
# torch 2.x runs its subgroup tests only at WORLD_SIZE 8 or more ("Skipped due to small world
# size."; torch 1.13 runs them at 3): those run again at 8, where they must pass.
"$python" -c '
import json, sys
run = json.load(open(sys.argv[1]))
for name, why in run["skipped"].items():
    if why.startswith("Skipped due to small world size"):
        print(name)
' "$work/ws3.json" >"$work/names8"
if [[ -s $work/names8 ]]; then
  WORLD_SIZE=8 "$python" "$here/torch_distributed_test.py" --fork --tests "$work/names8" --summary "$work/ws8.json" ||
    status=1
fi
# Every named test must have run and passed: a skip would hide a test that stopped applying.
"$python" - "$work" <<'PY' || status=1
import json, os, sys
work = sys.argv[1]
names = open(os.path.join(work, "names")).read().split()
ws3 = json.load(open(os.path.join(work, "ws3.json")))
ws8 = json.load(open(os.path.join(work, "ws8.json"))) if os.path.exists(os.path.join(work, "ws8.json")) else None
at8 = set(ws8["passed"]) if ws8 else set()
passed = [n for n in names if n in ws3["passed"] or n in at8]
missing = [n for n in names if n not in passed]
print(f"torch_subset: {len(passed)} of {len(names)} passed"
      + (f", {len(at8)} of them at WORLD_SIZE 8 (torch runs them only there)" if at8 else "")
      + (f"; not passed: {missing}" if missing else ""))
for n in missing:
    why = ws3["skipped"].get(n) or (ws8 or {"skipped": {}})["skipped"].get(n)
    if why:
        print(f"  {n}: skipped: {why}")
sys.exit(1 if missing else 0)
PY
exit $status
