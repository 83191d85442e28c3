#!/usr/bin/env bash
# The package on PyPI's torch 2.x, installed as docs/python.md says: a venv of its own (not the
# system's site-packages, where Debian's torch 1.13 is) with `pip install torch numpy expecttest`
# from PyPI, then `pip install SOURCE` into it with pip's build isolation on, then, from outside
# the source tree, with the venv's interpreter and the installed package:
#   - tutti, tutti.distributed (a c10d Backend for the CPU, built against the venv's torch) and
#     tutti.horovod.torch import from the venv's site-packages;
#   - tests/python/c10d/collectives_test.py at p = 2 under tutti-run (every collective checked
#     exactly, futures, the coalesced tensor collectives, and the profiler: tutti:all_reduce in the
#     Chrome trace), and at p = 3 under torch 2.x's own torchrun (env://, its store);
#   - tests/python/c10d/ddp_test.py at p = 2 (DDP's parameters equal gloo's exactly);
#   - Horovod's API (tests/python/horovod/collectives_test.py) at p = 2, and tutti.init() under
#     torchrun at p = 3 (tests/python/core/processes_test.py);
#   - ZeroRedundancyOptimizer and FSDP at p = 2 (tests/python/c10d/zero_fsdp_test.py);
#   - a script that exits without destroy_process_group() at p = 4 (tests/python/c10d/exit_test.py);
#   - the CI subset of PyTorch's own DistributedTest (tests/python/c10d/torch_subset.sh).
# Ranks start under TUTTI_RUN (tutti-run of any build: it does not depend on torch).
#
#   torch2_check.sh [--work DIR] [--venv DIR] [--tutti-run PATH] [--venv-only]
#
# --venv-only makes the venv and ends (scripts/test.sh fetches PyPI's torch so while it builds);
# a run holds WORK/venv.lock while it makes the venv, so a later run waits for an earlier one.
#
# WORK (default build/torch2-check) keeps the venv (unless --venv names one) and pip's CMake build
# directory (WORK/pip-build): a second run downloads nothing and recompiles only what changed. How
# the package is built (build type None, ccache shared with python.pip_install): scripts/
# pip_settings.sh. Exits 77 (skipped, said why) when the venv lacks torch and PyPI cannot
# be reached.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build/torch2-check
venv=
tutti_run=$root/build/tools/tutti-run
venv_only=0
while (($#)); do
  case $1 in
    --work) work=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --tutti-run) tutti_run=$2; shift 2 ;;
    --venv-only) venv_only=1; shift ;;
    *) echo "usage: $0 [--work DIR] [--venv DIR] [--tutti-run PATH] [--venv-only]" >&2; exit 2 ;;
  esac
done
fail() { echo "FAILED: $*"; exit 1; }
start=$(date +%s)
step=$start
took() { local now; now=$(date +%s); echo "ok: $1 ($((now - step)) s)"; step=$now; }
[[ $tutti_run == /* ]] || tutti_run=$PWD/$tutti_run
((venv_only)) || [[ -x $tutti_run ]] || fail "no tutti-run at $tutti_run (build the target tutti-run, or pass --tutti-run)"
mkdir -p "$work" || fail "mkdir $work"
work=$(cd "$work" && pwd)
venv=${venv:-$work/venv}
[[ $venv == /* ]] || venv=$PWD/$venv
python=$venv/bin/python

# 1. The venv, with PyPI's torch. Python >= 3.10 for torch 2.x; never the system's site-packages.
exec 9>"$work/venv.lock" && flock 9 || fail "locking $work/venv.lock"
if [[ ! -x $python ]]; then
  /usr/bin/python3 -m venv "$venv" || fail "python3 -m venv $venv"
fi
needed=(torch numpy expecttest)
if ! env -u PYTHONPATH "$python" -c "import torch, numpy, expecttest" 2>/dev/null; then
  if ! timeout 120 "$python" -m pip download --quiet --no-deps --dest "$work/probe" six >"$work/probe.log" 2>&1; then
    echo "SKIPPED: PyPI cannot be reached, and the venv lacks ${needed[*]}:"
    tail -n 3 "$work/probe.log"
    exit 77
  fi
  timeout 1200 "$python" -m pip install --quiet "${needed[@]}" >"$work/pip-deps.log" 2>&1 ||
    { tail -n 20 "$work/pip-deps.log"; fail "pip install ${needed[*]}"; }
fi
torch_version=$(env -u PYTHONPATH "$python" -c "import torch; print(torch.__version__)") || fail "import torch"
[[ $torch_version == 2.* ]] || fail "the venv's torch is $torch_version, not 2.x"
took "venv $venv with torch $torch_version"
exec 9>&-
((venv_only)) && exit 0

# 2. pip install SOURCE, build isolation on (pip fetches scikit-build-core and pybind11 for the
# build; the modules that pass torch objects compile against the pybind11 of the venv's torch).
# A copy of the sources without any build tree, as a user has them.
rm -rf "$work/src" && mkdir "$work/src" || fail "mkdir $work/src"
(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$work/src") || fail "copying the sources"
source "$root/scripts/pip_settings.sh"
if ! (cd "$work" && env -u PYTHONPATH timeout 1800 "$python" -m pip install --quiet "${pip_settings[@]}" "$work/src" \
  >"$work/pip.log" 2>&1); then
  grep -B2 -A12 "error" "$work/pip.log" | head -n 60
  fail "pip install $work/src into $venv"
fi
took "pip install with build isolation"

# 3. From outside the source tree, with the installed package.
cd "$work" || exit 1
unset PYTHONPATH
where=$("$python" -c '
import torch, tutti, tutti.distributed as td, tutti.horovod.torch as hvd
assert td._c10d.IS_BACKEND, "not a c10d Backend"
assert torch.__version__.startswith(td._c10d.TORCH_VERSION + "."), (td._c10d.TORCH_VERSION, torch.__version__)
assert torch.distributed.Backend.backend_capability["tutti"] == ["cpu"], torch.distributed.Backend.backend_capability
print(tutti.__file__)') || fail "importing tutti, tutti.distributed and tutti.horovod.torch from the venv"
[[ $where == "$venv/"* ]] || fail "tutti came from $where, not from the venv $venv"
took "import tutti, tutti.distributed (a c10d Backend for the CPU, torch $torch_version), tutti.horovod.torch"

run_ranks() {  # NAME LAUNCHER... : a job of the venv's interpreter, its log in WORK/NAME.log
  local name=$1
  shift
  if ! env PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 TUTTI_TIMEOUT_MS=60000 TRACE_DIR="$work" timeout 300 "$@" >"$work/$name.log" 2>&1; then
    grep -v "Warning\|return func" "$work/$name.log" | tail -n 25
    fail "$name on torch $torch_version"
  fi
  grep -h "checks passed\|ddp_test:\|passed\|^Ran [0-9]* test" "$work/$name.log" | sort -u | sed 's/^\[0\] /  /' | head -n 4
}
tutti_run2=("$tutti_run" -n 2 --timeout-ms 60000 "$python")
torchrun3=("$venv/bin/torchrun" --standalone --nproc_per_node 3)
rm -f "$work"/trace-rank*.json
run_ranks collectives "${tutti_run2[@]}" "$root/tests/python/c10d/collectives_test.py"
grep -q "tutti:all_reduce" "$work/trace-rank0.json" 2>/dev/null || fail "the profiler trace lacks tutti:all_reduce"
took "collectives at p = 2 (with the profiler: tutti:all_reduce in the trace)"
run_ranks ddp "${tutti_run2[@]}" "$root/tests/python/c10d/ddp_test.py"
took "DDP at p = 2, parameters equal to gloo's"
run_ranks zero_fsdp "${tutti_run2[@]}" "$root/tests/python/c10d/zero_fsdp_test.py" && took "ZeRO and FSDP at p = 2, parameters equal to gloo's"
run_ranks exit "$tutti_run" -n 4 --timeout-ms 60000 "$python" "$root/tests/python/c10d/exit_test.py"
took "exit without destroy_process_group at p = 4, works in flight"
run_ranks collectives_torchrun "${torchrun3[@]}" "$root/tests/python/c10d/collectives_test.py"
took "collectives at p = 3 under torch $torch_version's torchrun"
run_ranks core_torchrun "${torchrun3[@]}" "$root/tests/python/core/processes_test.py"
took "tutti.init() at p = 3 under torch $torch_version's torchrun"
run_ranks horovod "${tutti_run2[@]}" "$root/tests/python/horovod/collectives_test.py"
took "Horovod's API at p = 2"
PYTHON=$python bash "$root/tests/python/c10d/torch_subset.sh" "$work" >"$work/torch_subset.log" 2>&1 ||
  { tail -n 30 "$work/torch_subset.log"; fail "PyTorch's DistributedTest subset on torch $torch_version"; }
tail -n 1 "$work/torch_subset.log" | sed 's/^/  /'
took "PyTorch's DistributedTest subset"
# 4. The package of TUTTI_RUN's build, when built against another torch (Debian's 1.13): importing
# its torch modules here raises ImportError naming both versions, rather than ending the process.
other=$(dirname "$(dirname "$tutti_run")")/python
if [[ -f $other/tutti/_torch_version.py ]] && ! grep -q "\"${torch_version%%.*}\." "$other/tutti/_torch_version.py"; then
  for module in tutti.distributed tutti.horovod.torch; do
    out=$(PYTHONPATH=$other timeout 60 "$python" -c "import $module" 2>&1)
    grep -q "ImportError: $module was built against torch .*, but this process imports torch $torch_version" <<<"$out" ||
      { echo "$out" | tail -n 5; fail "import $module of a build for another torch: no ImportError naming both"; }
  done
  took "a build for another torch refused at import (ImportError naming both)"
fi
echo "torch2_check: passed on torch $torch_version in $(($(date +%s) - start)) s"
