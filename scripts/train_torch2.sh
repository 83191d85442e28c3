#!/usr/bin/env bash
# tutti-train and the libtorch pieces (include/tutti/torch*.hpp) built against PyPI's torch 2.x
# wheel's libtorch (its `torch/share/cmake/Torch`), not Debian's: a CMake build of its own,
# configured with the venv's interpreter (CMake asks it for torch.utils.cmake_prefix_path and
# searches there first), then tests/tools/train/train_test.sh with that tutti-train: training at p = 2 converges
# with parameters identical on both ranks, with and without overlap and with every compressor, and
# the bad inputs are refused. CI builds tutti-train against Debian's libtorch; this is the script
# for the wheel's (docs/training.md).
#
#   train_torch2.sh [--work DIR] [--venv DIR]
#
# VENV (default WORK/../torch2-check/venv, the one scripts/torch2_check.sh makes) must have torch
# 2.x. WORK (default build/train-torch2) keeps the build: a second run recompiles only what changed.
# Exits 77 when the venv lacks torch 2.x, or when the Fashion-MNIST files are not installed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build/train-torch2
venv=
while (($#)); do
  case $1 in
    --work) work=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    *) echo "usage: $0 [--work DIR] [--venv DIR]" >&2; exit 2 ;;
  esac
done
fail() { echo "FAILED: $*"; exit 1; }
mkdir -p "$work" || fail "mkdir $work"
work=$(cd "$work" && pwd)
venv=${venv:-$(dirname "$work")/torch2-check/venv}
python=$venv/bin/python
torch_version=$(env -u PYTHONPATH "$python" -c "import torch; print(torch.__version__)" 2>/dev/null) ||
  { echo "SKIPPED: no torch in $venv (scripts/torch2_check.sh makes that venv)"; exit 77; }
[[ $torch_version == 2.* ]] || { echo "SKIPPED: the venv's torch is $torch_version, not 2.x"; exit 77; }
start=$(date +%s)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# The wheel's libtorch_cuda.so needs the NCCL, cuDNN, ... of the nvidia-* wheels beside it (found at
# run time through its RPATH, $ORIGIN/../../nvidia/*/lib). At link time a CUDA toolkit's own older
# libnccl.so.2 (/usr/local/cuda/lib64, on the link line through torch's CMake config) would be
# taken instead and lack symbols: -rpath-link names the wheels' directories first.
site=$(env -u PYTHONPATH "$python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
rpath_link=$(find "$site/nvidia" -mindepth 2 -maxdepth 2 -type d -name lib 2>/dev/null | sort | sed 's/^/-Wl,-rpath-link,/' | tr '\n' ' ')
if [[ ! -f $work/build.ninja ]]; then
  env -u PYTHONPATH cmake -S "$root" -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$python" \
    -DCMAKE_EXE_LINKER_FLAGS="$rpath_link" \
    -DTUTTI_WERROR=ON -DTUTTI_CUDA=OFF -DTUTTI_PYTHON=OFF -DTUTTI_BUILD_TESTS=OFF -DTUTTI_BUILD_BENCHMARKS=OFF \
    "${launcher[@]}" >"$work/configure.log" 2>&1 ||
    { tail -n 30 "$work/configure.log"; rm -f "$work/build.ninja"; fail "configuring $work"; }
fi
# The build must have found the wheel's libtorch, not /usr's.
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$work/CMakeCache.txt")
[[ $torch_dir == "$venv"/* ]] || fail "CMake found libtorch at '$torch_dir', not in $venv"
echo "ok: configured against $torch_dir (torch $torch_version)"
# -j 2: a translation unit of tutti-train takes up to 8 GB with torch 2.x's headers at -O3.
if ! env -u PYTHONPATH timeout 3600 cmake --build "$work" -j 2 --target tutti-train tutti-run >"$work/build.log" 2>&1; then
  grep -B2 -A12 "error" "$work/build.log" | head -n 60
  fail "building tutti-train against torch $torch_version"
fi
ldd "$work/tools/train/tutti-train" | grep -q "$venv/.*libtorch" ||
  fail "tutti-train does not load the wheel's libtorch: $(ldd "$work/tools/train/tutti-train" | grep libtorch)"
echo "ok: built tutti-train against torch $torch_version ($(($(date +%s) - start)) s)"
bash "$root/tests/tools/train/train_test.sh" "$work/tools/tutti-run" "$work/tools/train/tutti-train"
status=$?
echo "train_torch2: train_test.sh on torch $torch_version exited $status ($(($(date +%s) - start)) s in all)"
exit $status
