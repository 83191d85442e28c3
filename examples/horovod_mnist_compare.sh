#!/usr/bin/env bash
# Horovod's MNIST example over tutti.horovod.torch on Fashion-MNIST, at p = 1 and p = 2 under
# tutti-run, and at p = 1 with p = 2's global batch and learning rate (--batch-size 128 --lr 0.02,
# the defaults doubled): prints the test accuracy after every epoch of each (docs/horovod.md).
#
#   examples/horovod_mnist_compare.sh [--horovod-example PATH] [--build DIR] [-- EXAMPLE ARGS...]
#
# --horovod-example PATH: Horovod's own examples/pytorch/pytorch_mnist.py (not shipped with Tutti:
#   fetch it from github.com/horovod/horovod). It runs with its two import lines changed
#   (`import horovod` -> `import tutti.horovod as horovod`, `import horovod.torch as hvd` ->
#   `import tutti.horovod.torch as hvd`) and needs torchvision and filelock (python3-torchvision,
#   python3-filelock); Fashion-MNIST is laid out where its datasets.MNIST looks, so it reads it
#   instead of downloading MNIST.
# Without it: examples/horovod_mnist.py, Tutti's equivalent of that script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/../build
horovod_example=
data=/usr/share/datasets/fashion-mnist
while [[ $# -gt 0 ]]; do
  case $1 in
    --horovod-example) horovod_example=$(realpath "$2"); shift 2 ;;
    --build) build=$(realpath "$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [--horovod-example PATH] [--build DIR] [-- EXAMPLE ARGS...]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -n $horovod_example ]]; then
  mkdir -p "$work/data/MNIST/raw"
  for f in "$data"/*-ubyte.gz; do gzip -dc "$f" >"$work/data/MNIST/raw/$(basename "$f" .gz)"; done
  sed -e 's/^import horovod\.torch as hvd$/import tutti.horovod.torch as hvd/' \
      -e 's/^import horovod$/import tutti.horovod as horovod/' "$horovod_example" >"$work/example.py"
  changed=$(diff "$horovod_example" "$work/example.py" | grep -c '^>' || true)
  if [[ $changed -ne 2 ]]; then
    echo "$horovod_example: expected the two import lines 'import horovod' and 'import horovod.torch as hvd'" >&2
    exit 1
  fi
  echo "running Horovod's example with its two import lines changed:"
  diff "$horovod_example" "$work/example.py" || true
  args=(--data-dir "$work/data" "$@")
else
  cp "$here/horovod_mnist.py" "$work/example.py"
  args=(--data-dir "$data" "$@")
fi
cd "$work"
# run LABEL RANKS EXTRA_ARGS...
run() {
  local label=$1 p=$2 start
  shift 2
  start=$(date +%s)
  PYTHONPATH=$build/python OMP_NUM_THREADS=1 "$build/tools/tutti-run" -n "$p" /usr/bin/python3 example.py \
    --log-interval 100000 "${args[@]}" "$@" >out 2>&1 || { cat out; echo "$label failed" >&2; exit 1; }
  echo "$label ($(($(date +%s) - start)) s):"
  grep -o 'Test set: .*' out | nl -w2 -s'. epoch: '
}
run "p = 1" 1
run "p = 2" 2
# The same steps as p = 2 in one process (its samples in another order): what p = 2 should reach.
run "p = 1, batch 128, lr 0.02" 1 --batch-size 128 --lr 0.02
