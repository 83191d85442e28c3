#!/usr/bin/env bash
# tools/sim/model_profile.py on torchvision's resnet18 at 32x32 pixels (a few seconds): the profile
# lists every parameter once with its element count, in backward's order (fc first, the stem last),
# without scaling at the measured batch, and with --scale-to-throughput at exactly the target
# images/s; bad arguments fail with a message, not a traceback, and leave no file.
# Usage: sim_model_profile_test.sh [MODEL_PROFILE_PY]. Without torchvision it exits 77 (skipped).
set -u
here=$(cd "$(dirname "$0")" && pwd)
script=${1:-$here/../../../tools/sim/model_profile.py}
py=/usr/bin/python3
if ! "$py" -c "import torchvision" 2>/dev/null; then
  echo "SKIP: /usr/bin/python3 has no torchvision"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
small=(--model resnet18 --image-size 32 --measure-batch 2 --steps 2 --warmup 1 --threads 1)

timeout 120 "$py" "$script" "${small[@]}" -o "$work/raw.profile" || fail "unscaled run"
timeout 120 "$py" "$script" "${small[@]}" --scale-to-throughput 250 --batch 64 --note "a test note" \
  -o "$work/scaled.profile" || fail "scaled run"

# Checks profiles against the model itself: names, counts, order, batch and throughput.
check() {  # FILE BATCH IMAGES_PER_S (0: not scaled), for each profile
  "$py" - "$@" <<'EOF'
import re, sys, torchvision
model = torchvision.models.resnet18(weights=None)
params = {n: p.numel() for n, p in model.named_parameters()}

def check(path, batch, rate):
    lines = [l.rstrip("\n") for l in open(path)]
    assert lines[0] == "tutti-profile 1", lines[0]
    fields, grads = {}, []
    for l in lines[1:]:
        key, rest = l.split(" ", 1)
        if key == "grad":
            name, count, kind, seconds = rest.split(" ")
            assert kind == "f32" and float(seconds) >= 0, l
            grads.append((name, int(count), float(seconds)))
        elif key != "note":
            fields[key] = rest
    assert fields["model"] == "resnet18" and int(fields["batch"]) == batch, fields
    names = [g[0] for g in grads]
    assert len(names) == len(set(names)) == len(params), (len(names), len(set(names)), len(params))
    assert {n: c for n, c, _ in grads} == params, "element counts differ from the model's"
    assert sum(params.values()) == 11689512
    assert names[0].startswith("fc.") and names[1].startswith("fc."), names[:2]
    assert re.match(r"(conv1|bn1)\.", names[-1]), names[-1]
    total = float(fields["forward"]) + float(fields["optimizer"]) + sum(g[2] for g in grads)
    if rate > 0:
        assert abs(batch / total - rate) <= rate * 1e-6, (batch / total, rate)
        assert "note a test note" in lines, "the --note line"
        assert any(l.startswith("note scaled:") for l in lines)
    else:
        assert any(l.startswith("note not scaled") for l in lines)

args = sys.argv[1:]
for i in range(0, len(args), 3):
    try:
        check(args[i], int(args[i + 1]), float(args[i + 2]))
    except AssertionError as e:
        sys.exit(f"{args[i]}: {e!r}")
EOF
}
check "$work/raw.profile" 2 0 "$work/scaled.profile" 64 250 || fail "the profiles' contents"

# Bad arguments: a message naming the problem, exit status 2 (argparse) or 1, no traceback, no file.
expect_error() {  # PATTERN ARGS...
  local pattern=$1
  shift
  local out
  out=$(timeout 60 "$py" "$script" "$@" -o "$work/bad.profile" 2>&1)
  local rc=$?
  [ $rc -ne 0 ] || fail "$* succeeded"
  grep -q "$pattern" <<<"$out" || fail "$*: no \"$pattern\" in: $out"
  if grep -q Traceback <<<"$out"; then fail "$*: traceback: $out"; fi
  [ ! -e "$work/bad.profile" ] || fail "$*: wrote a profile"
}
expect_error "go together" --model resnet18 --scale-to-throughput 10
expect_error "must be >= 1" --model resnet18 --measure-batch 0
expect_error 'no model "nosuchnet"' --model nosuchnet

if [ $failures -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "OK"
