#!/usr/bin/env bash
# tools/ddp_peer.py's compression hooks and argument checks: a short run at p = 2 with each of
# --compression fp16 and powersgd:2 must train (a summary line with a test accuracy above chance)
# and name its compression; bf16, a malformed rank and --no-overlap with a hook are refused with
# a message, not a traceback. Usage: ddp_peer_test.sh [DDP_PEER_PY]. Without PyTorch or the
# Fashion-MNIST files it exits 77 (skipped).
set -u
here=$(cd "$(dirname "$0")" && pwd)
script=${1:-$here/../../../tools/ddp_peer.py}
py=/usr/bin/python3
data=/usr/share/datasets/fashion-mnist
if ! "$py" -c "import torch" 2>/dev/null || [[ ! -e $data/train-images-idx3-ubyte.gz ]]; then
  echo "SKIPPED: needs /usr/bin/python3 with torch (python3-torch) and $data (dataset-fashion-mnist)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for compression in fp16 powersgd:2; do
  out=$work/run.log
  timeout -s KILL 240 "$py" "$script" -n 2 --epochs 1 --train-samples 1536 --test-samples 400 \
    --compression "$compression" >"$out" 2>&1 || { fail "$compression: exit $?"; sed 's/^/  /' "$out"; continue; }
  grep -q "compression=$compression " "$out" || fail "$compression: the header does not name it"
  accuracy=$(sed -n 's/.*summary .*test_acc=\([0-9.]*\).*/\1/p' "$out")
  if [[ -z $accuracy ]] || ! awk -v a="$accuracy" 'BEGIN { exit !(a > 0.2) }'; then
    fail "$compression: test accuracy '${accuracy}' (chance is 0.1)"; sed 's/^/  /' "$out"
  else
    echo "ok: --compression $compression trains (test accuracy $accuracy after 1536 samples)"
  fi
done

refused() {  # refused EXPECTED-TEXT ARGS...: exits 2 with EXPECTED-TEXT on stderr, no traceback
  local expected=$1 out=$work/refused.log status=0
  shift
  "$py" "$script" "$@" >"$out" 2>&1 || status=$?
  if [[ $status -ne 2 ]] || ! grep -q -- "$expected" "$out" || grep -q Traceback "$out"; then
    fail "$* should be refused with '$expected' (status $status)"; sed 's/^/  /' "$out"
  else
    echo "ok: $* refused"
  fi
}
refused "Gloo has no bfloat16 allreduce" --compression bf16
refused "expected none, fp16 or powersgd:RANK" --compression powersgd:0
refused "bypasses" --compression fp16 --no-overlap
status=0
env -u TUTTI_RANK -u TUTTI_SIZE "$py" "$script" --from-env >"$work/env.log" 2>&1 || status=$?
if [[ $status -ne 1 ]] || ! grep -q "TUTTI_RANK and TUTTI_SIZE must be set" "$work/env.log"; then
  fail "--from-env without a job: status $status"; sed 's/^/  /' "$work/env.log"
else
  echo "ok: --from-env without a job refused"
fi
echo "ddp_peer_test: $failures failed"
((failures == 0))
