#!/usr/bin/env bash
# The torch.distributed backend "tutti" on PyPI's torch 2.x: a venv of its own (not the system's
# site-packages, where Debian's torch 1.13 is) with `pip install torch numpy` from PyPI, the
# package's modules built against that torch in a build directory of their own, then, from outside
# the source tree, with the venv's interpreter:
#   - the backend imports as a c10d Backend for the CPU, built against the venv's torch;
#   - tests/python/c10d/collectives_test.py at p = 2 (every collective checked exactly, futures,
#     the coalesced tensor collectives, and the profiler: tutti:all_reduce in the Chrome trace);
#   - tests/python/c10d/ddp_test.py at p = 2 (DDP's parameters equal gloo's exactly).
# Ranks start under TUTTI_RUN (tutti-run of any build: it does not depend on torch).
#
#   torch2_check.sh [--work DIR] [--venv DIR] [--tutti-run PATH]
#
# WORK (default build/torch2-check) keeps the venv (unless --venv names one) and the build
# directory: a second run installs nothing and rebuilds only what changed. It builds with CMake,
# not `pip install .`: pip builds every module, and tutti.horovod.torch does not compile against
# torch 2.x yet (include/tutti/torch_broadcast.hpp), so pip install . fails there.
# Exits 77 (skipped, said why) when the venv lacks torch and PyPI cannot be reached.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build/torch2-check
venv=
tutti_run=$root/build/tools/tutti-run
while (($#)); do
  case $1 in
    --work) work=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --tutti-run) tutti_run=$2; shift 2 ;;
    *) echo "usage: $0 [--work DIR] [--venv DIR] [--tutti-run PATH]" >&2; exit 2 ;;
  esac
done
venv=${venv:-$work/venv}
fail() { echo "FAILED: $*"; exit 1; }
start=$(date +%s)
step=$start
took() { local now; now=$(date +%s); echo "ok: $1 ($((now - step)) s)"; step=$now; }
[[ -x $tutti_run ]] || fail "no tutti-run at $tutti_run (build the target tutti-run, or pass --tutti-run)"
mkdir -p "$work" || fail "mkdir $work"
work=$(cd "$work" && pwd)
python=$venv/bin/python

# 1. The venv, with PyPI's torch. Python >= 3.10 for torch 2.x; never the system's site-packages.
if [[ ! -x $python ]]; then
  /usr/bin/python3 -m venv "$venv" || fail "python3 -m venv $venv"
fi
needed=(torch numpy)
if ! env -u PYTHONPATH "$python" -c "import torch, numpy" 2>/dev/null; then
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

# 2. The package's modules for the venv's torch: a CMake build of its own (only _c10d and _tutti,
# with what they need; no tests, tools or benchmarks), the way docs/torch-distributed.md describes.
# CMake is pointed at the venv's torch (CMAKE_PREFIX_PATH: else it may find a system libtorch first,
# which the build refuses); TORCH_CUDA_ARCH_LIST spares torch's CMake config (CUDA wheels) a
# GPU-detection try_run, which fails with CMake 3.25's nvcc and C++20.
prefix=$(env -u PYTHONPATH "$python" -c "import torch; print(torch.utils.cmake_prefix_path)")
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [[ ! -f $work/build/build.ninja ]]; then
  # Build type None (no optimisation, no debug information): the check is functional. Measured
  # 2026-11-28 on 2 idle cores: configure 23 s, _c10d and _tutti from nothing 154 s.
  env -u PYTHONPATH cmake -S "$root" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=None -DPython_EXECUTABLE="$python" -DCMAKE_PREFIX_PATH="$prefix" \
    -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" -DTUTTI_WERROR=ON -DTUTTI_CUDA=OFF -DTUTTI_BUILD_TESTS=OFF \
    -DTUTTI_BUILD_TOOLS=OFF -DTUTTI_BUILD_BENCHMARKS=OFF "${launcher[@]}" >"$work/configure.log" 2>&1 ||
    { tail -n 30 "$work/configure.log"; rm -f "$work/build/build.ninja"; fail "configuring $work/build"; }
fi
took "configured $work/build for torch $torch_version"
if ! env -u PYTHONPATH timeout 1800 cmake --build "$work/build" --target _c10d _tutti >"$work/build.log" 2>&1; then
  grep -B2 -A12 "error" "$work/build.log" | head -n 60
  fail "building _c10d and _tutti in $work/build"
fi
took "built _c10d and _tutti"

# 3. From outside the source tree, with the package of that build.
cd "$work" || exit 1
export PYTHONPATH=$work/build/python
where=$("$python" -c '
import torch, tutti, tutti.distributed as td
assert td._c10d.IS_BACKEND, "not a c10d Backend"
assert torch.__version__.startswith(td._c10d.TORCH_VERSION + "."), (td._c10d.TORCH_VERSION, torch.__version__)
assert torch.distributed.Backend.backend_capability["tutti"] == ["cpu"], torch.distributed.Backend.backend_capability
print(tutti.__file__)') || fail "importing tutti.distributed from the venv"
[[ $where == "$work/build/python/"* ]] || fail "tutti came from $where, not from $work/build/python"
took "import tutti.distributed: a c10d Backend for the CPU, built against torch $torch_version"

run_ranks() {  # NAME SCRIPT: SCRIPT at p = 2 under tutti-run with the venv's interpreter
  if ! env PYTHONDONTWRITEBYTECODE=1 TUTTI_TIMEOUT_MS=60000 TRACE_DIR="$work" timeout 300 "$tutti_run" -n 2 \
    --timeout-ms 60000 "$python" "$root/tests/python/c10d/$2" >"$work/$1.log" 2>&1; then
    grep -v "Warning\|return func" "$work/$1.log" | tail -n 25
    fail "$1 at p = 2 on torch $torch_version"
  fi
  grep -h "checks passed\|ddp_test:" "$work/$1.log" | sed 's/^\[0\] /  /'
}
rm -f "$work"/trace-rank*.json
run_ranks collectives collectives_test.py
grep -q "tutti:all_reduce" "$work/trace-rank0.json" 2>/dev/null || fail "the profiler trace lacks tutti:all_reduce"
took "collectives at p = 2 (with the profiler: tutti:all_reduce in the trace)"
run_ranks ddp ddp_test.py
took "DDP at p = 2, parameters equal to gloo's"
echo "torch2_check: passed on torch $torch_version in $(($(date +%s) - start)) s"
