#!/usr/bin/env bash
# The package as docs/python.md installs it: a fresh venv on the system's Python (with its
# site-packages, where Debian's torch is), `pip install SOURCE` with pip's build isolation on (so
# the build gets the newest pybind11 and scikit-build-core from PyPI, as a user's does), then from
# outside the source tree: `import tutti`, `tutti.distributed` and `tutti.horovod.torch` come from
# the venv, and DDP on backend "tutti" at p = 2 (tests/python/c10d/ddp_test.py, parameters checked
# exactly against gloo's) runs on the installed package. Exits 77 (skipped, said why) when PyPI
# cannot be reached.
#
#   pip_install_test.sh SOURCE_DIR TUTTI_RUN
set -uo pipefail
source_dir=$1
tutti_run=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=/usr/bin/python3
fail() { echo "FAILED: $*"; exit 1; }

"$python" -m venv --system-site-packages "$work/venv" || fail "python3 -m venv"
venv_python=$work/venv/bin/python
if ! timeout 120 "$venv_python" -m pip download --quiet --no-deps --dest "$work/probe" scikit-build-core \
  >"$work/probe.log" 2>&1; then
  echo "SKIPPED: PyPI cannot be reached, and pip install . needs its build requirements from there:"
  tail -n 3 "$work/probe.log"
  exit 77
fi

# A copy of the sources without any build tree: what a user has.
mkdir "$work/src"
(cd "$source_dir" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$work/src") ||
  fail "copying the sources"
# Build type None, WORK/pip-build, ccache shared with scripts/torch2_check.sh (scripts/pip_settings.sh).
source "$source_dir/scripts/pip_settings.sh"
start=$(date +%s)
if ! (cd "$work" && timeout 1500 "$venv_python" -m pip install --quiet "${pip_settings[@]}" "$work/src" \
  >"$work/pip.log" 2>&1); then
  tail -n 40 "$work/pip.log"
  fail "pip install"
fi
echo "ok: pip install with build isolation ($(($(date +%s) - start)) s)"

cd "$work" || exit 1
where=$(env -u PYTHONPATH "$venv_python" -c '
import tomllib, tutti, tutti.distributed, tutti.horovod.torch
with open("'"$source_dir"'/pyproject.toml", "rb") as f:
    assert tutti.__version__ == tomllib.load(f)["project"]["version"], tutti.__version__
print(tutti.__file__)') || fail "importing tutti, tutti.distributed and tutti.horovod.torch from the venv"
[[ $where == "$work/venv/"* ]] || fail "tutti came from $where, not from the venv"
echo "ok: import tutti, tutti.distributed, tutti.horovod.torch ($where)"

if ! env -u PYTHONPATH TUTTI_TIMEOUT_MS=60000 timeout 300 "$tutti_run" -n 2 --timeout-ms 60000 "$venv_python" \
  "$source_dir/tests/python/c10d/ddp_test.py" >"$work/ddp.log" 2>&1; then
  tail -n 20 "$work/ddp.log"
  fail "DDP on backend tutti at p = 2 from the installed package"
fi
echo "ok: DDP on backend tutti at p = 2 from the installed package"
