#!/usr/bin/env bash
# Runs Horovod's own PyTorch test suite (test/parallel/test_torch.py of Horovod 0.28.1) against
# tutti.horovod.torch, under tutti-run, and prints each rank's passed/failed/skipped counts and the
# tests that failed or were skipped, with the first line of their reason (docs/horovod.md).
#
#   scripts/horovod_suite.sh [-n RANKS] [-k PYTEST_EXPRESSION] [HOROVOD_SOURCE]
#
# HOROVOD_SOURCE: a Horovod source tree (holding test/parallel/test_torch.py) or the test file
# itself. Without it the suite is taken from PyPI's horovod==0.28.1 source distribution where that
# holds test/ (0.28.1's does not), else from github.com/horovod/horovod at v0.28.1; where neither
# is reachable the script exits 77 saying so. Nothing of Horovod's is kept: the suite is copied
# into a temporary directory, removed at exit.
#
# `import horovod.torch as hvd` reaches tutti.horovod.torch through a shim package written into
# that directory; the suite's helper module `common` (test/utils/common.py, which needs Horovod's
# runner) is replaced by the three functions the suite takes from it. The ranks run as Horovod's
# suite runs under mpirun (no HOROVOD_RANK: the tests written for Gloo's controller skip).
#
# Exits with tutti-run's status: 0 when no test failed on any rank.
#
# Environment: TUTTI_BUILD (default: build/ of this checkout, with the targets _horovod, _tutti
# and tutti-run built), PYTHON (default /usr/bin/python3, the Python with Debian's torch).
# pytest is installed into $TUTTI_BUILD/pydeps when that Python lacks it.
set -euo pipefail

HOROVOD_VERSION=0.28.1
ranks=2
filter=()
while getopts "n:k:h" opt; do
  case $opt in
    n) ranks=$OPTARG ;;
    k) filter=(-k "$OPTARG") ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
source_arg=${1:-}

root=$(cd "$(dirname "$0")/.." && pwd)
build=${TUTTI_BUILD:-$root/build}
python=${PYTHON:-/usr/bin/python3}
run=$build/tools/tutti-run
[[ -x $run && -d $build/python/tutti/horovod ]] || {
  echo "horovod_suite: build the targets _horovod, _tutti and tutti-run in $build first" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/horovod_suite.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- the suite -----------------------------------------------------------------------------------
suite=$work/parallel/test_torch.py
mkdir -p "$work/parallel"
if [[ -n $source_arg ]]; then
  if [[ -f $source_arg ]]; then cp "$source_arg" "$suite"
  elif [[ -f $source_arg/test/parallel/test_torch.py ]]; then cp "$source_arg/test/parallel/test_torch.py" "$suite"
  else echo "horovod_suite: no test/parallel/test_torch.py in $source_arg" >&2; exit 2
  fi
else
  if "$python" -m pip download --quiet "horovod==$HOROVOD_VERSION" --no-deps --no-binary :all: -d "$work/sdist" \
       >/dev/null 2>&1 &&
     tar -xzf "$work/sdist/horovod-$HOROVOD_VERSION.tar.gz" -C "$work/sdist" \
       "horovod-$HOROVOD_VERSION/test/parallel/test_torch.py" 2>/dev/null; then
    cp "$work/sdist/horovod-$HOROVOD_VERSION/test/parallel/test_torch.py" "$suite"
  elif curl -fsSL --max-time 60 -o "$suite" \
       "https://raw.githubusercontent.com/horovod/horovod/v$HOROVOD_VERSION/test/parallel/test_torch.py"; then
    :
  else
    echo "horovod_suite: Horovod's test suite is not in PyPI's horovod-$HOROVOD_VERSION sdist and GitHub is not" \
         "reachable; pass a Horovod source tree (git clone -b v$HOROVOD_VERSION https://github.com/horovod/horovod)" >&2
    exit 77
  fi
fi

# --- pytest ---------------------------------------------------------------------------------------
pythonpath=$work/shim:$build/python
if ! "$python" -m pytest --version >/dev/null 2>&1; then
  if ! PYTHONPATH=$build/pydeps "$python" -m pytest --version >/dev/null 2>&1; then
    "$python" -m pip install --quiet --target "$build/pydeps" pytest >&2
  fi
  pythonpath=$pythonpath:$build/pydeps
fi

# --- the alias: horovod -> tutti.horovod ----------------------------------------------------------
mkdir -p "$work/shim/horovod"
cat > "$work/shim/horovod/__init__.py" <<'EOF'
# horovod -> tutti.horovod, for Horovod's test suite: `import horovod.torch` gives tutti.horovod.torch.
import sys
from tutti.horovod import *  # noqa: F401,F403
import tutti.horovod as _tutti_horovod  # noqa: E402
__version__ = getattr(_tutti_horovod, "__version__", "")
import tutti.horovod.torch as torch  # noqa: E402
sys.modules[__name__ + ".torch"] = torch
EOF
cat > "$work/shim/common.py" <<'EOF'
# What Horovod's suite takes from its test/utils/common.py, for ranks started by tutti-run.
import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    """The launcher's rank and size (tutti-run's, else mpirun's), or (0, 1) alone."""
    for rank_var, size_var in (("TUTTI_RANK", "TUTTI_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if os.environ.get(rank_var) is not None and os.environ.get(size_var) is not None:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    with tempfile.TemporaryDirectory() as directory:
        yield os.path.join(directory, "temp_test_file")
EOF

# --- the run --------------------------------------------------------------------------------------
cd "$work"
echo "horovod_suite: Horovod $HOROVOD_VERSION's test_torch.py, $ranks ranks, $(date -u +%FT%TZ)" >&2
start=$(date +%s)
status=0
# A collective some rank never reaches fails after 30 s (stall limit, operation deadline) instead
# of hanging; the whole run is bounded too.
env PYTHONPATH="$pythonpath" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 TUTTI_STALL_SHUTDOWN_S=30 \
    TUTTI_TIMEOUT_MS=${TUTTI_TIMEOUT_MS:-30000} \
    timeout 1800 "$run" -n "$ranks" bash -c \
    'exec "$0" -m pytest -p no:cacheprovider -q -rN --junitxml="results.$TUTTI_RANK.xml" "$@" >"log.$TUTTI_RANK" 2>&1' \
    "$python" "$suite" "${filter[@]}" || status=$?
elapsed=$(($(date +%s) - start))

"$python" - "$ranks" <<'EOF'
import sys
import xml.etree.ElementTree as ET

for rank in range(int(sys.argv[1])):
    try:
        cases = ET.parse("results.%d.xml" % rank).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        print("rank %d: no results (%s); the end of its log:" % (rank, e))
        try:
            print("".join(open("log.%d" % rank).readlines()[-30:]))
        except OSError:
            pass
        continue
    passed, failed, skipped = [], [], []
    for case in cases:
        name = case.get("name")
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            passed.append(name)
            continue
        reason = (outcome.get("message") or "").strip().splitlines()
        reason = reason[0][:200] if reason else ""
        (skipped if outcome.tag == "skipped" else failed).append((name, reason))
    print("rank %d: %d passed, %d failed, %d skipped" % (rank, len(passed), len(failed), len(skipped)))
    for kind, items in (("FAILED", failed), ("SKIPPED", skipped)):
        for name, reason in items:
            print("  %s %s: %s" % (kind, name, reason))
EOF
echo "horovod_suite: $elapsed s; tutti-run exited $status" >&2
exit "$status"
