#!/usr/bin/env bash
# tools/plot_timeline.py on a made-up Chrome trace: two ranks, a step lane each (FORWARD, BACKWARD,
# OPTIMIZER as "X" events) and tensor lanes (NEGOTIATE, QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE,
# MEMCPY_OUT_FUSION_BUFFER as "B"/"E" pairs, one nested), named by "M" events. Checks that it
# writes valid PNGs (default window, --start-ms/--span-ms, --max-lanes, a bare array, an array cut
# short) and that bad input fails with a message naming the file, not a traceback.
# Usage: plot_timeline_test.sh [PLOT_TIMELINE_PY]. Without python3-matplotlib it exits 77 (skipped).
set -u
here=$(cd "$(dirname "$0")" && pwd)
script=${1:-$here/../../../tools/plot_timeline.py}
py=/usr/bin/python3
if ! "$py" -c "import matplotlib" 2>/dev/null; then
  echo "SKIP: python3-matplotlib is not installed"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# 12 steps of 20 ms on 2 ranks; 6 tensors per rank; times in microseconds.
"$py" - "$work/trace.json" "$work/bare.json" "$work/cut.json" <<'EOF'
import json, sys
events = []
tensors = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc2.weight"]
for pid in (0, 1):
    events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {pid}"}})
    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "step"}})
    for i, t in enumerate(tensors, 1):
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": i, "args": {"name": t}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": i,
                       "args": {"sort_index": i}})
    for step in range(12):
        t0 = 1000 + step * 20000 + pid * 150
        events.append({"ph": "X", "name": "FORWARD", "pid": pid, "tid": 0, "ts": t0, "dur": 5000})
        events.append({"ph": "X", "name": "BACKWARD", "pid": pid, "tid": 0, "ts": t0 + 5000, "dur": 10000})
        events.append({"ph": "X", "name": "OPTIMIZER", "pid": pid, "tid": 0, "ts": t0 + 16500, "dur": 2500})
        for i, t in enumerate(reversed(tensors), 1):
            s = t0 + 5000 + 1500 * i
            for name, d in (("NEGOTIATE", 300), ("QUEUE", 200), ("MEMCPY_IN_FUSION_BUFFER", 150),
                            ("ALLREDUCE", 900), ("MEMCPY_OUT_FUSION_BUFFER", 150)):
                events.append({"ph": "B", "name": name, "pid": pid, "tid": i, "ts": s})
                if name == "ALLREDUCE":  # a nested phase
                    events.append({"ph": "B", "name": "WAIT", "pid": pid, "tid": i, "ts": s + 200})
                    events.append({"ph": "E", "pid": pid, "tid": i, "ts": s + 600})
                events.append({"ph": "E", "pid": pid, "tid": i, "ts": s + d})
                s += d
events.append({"ph": "i", "name": "marker", "pid": 0, "tid": 0, "ts": 5000, "s": "t"})
json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, open(sys.argv[1], "w"))
json.dump(events, open(sys.argv[2], "w"))
with open(sys.argv[3], "w") as f:  # an array never closed, as a run cut short leaves it
    f.write("[\n" + "".join(json.dumps(e) + ",\n" for e in events))
EOF
[[ -s $work/trace.json ]] || { echo "FAIL: could not write the sample trace"; exit 1; }

# check_png NAME ARGS...: runs the script with -o NAME and checks the PNG it writes.
check_png() {
  local png=$work/$1
  shift
  if ! "$py" "$script" -o "$png" "$@" >"$work/out" 2>"$work/err"; then
    fail "plot_timeline.py $*: exit status $?: $(cat "$work/err")"
    return
  fi
  local magic size
  magic=$(head -c 8 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
  size=$(stat -c %s "$png" 2>/dev/null || echo 0)
  [[ $magic == 89504e470d0a1a0a ]] || fail "$png is not a PNG (magic $magic) for: $*"
  ((size > 10000)) || fail "$png is only $size bytes for: $*"
  [[ -s $work/err ]] && fail "plot_timeline.py $* wrote to stderr: $(cat "$work/err")"
}
check_png default.png "$work/trace.json"
grep -q "14 lanes, 9 event names" "$work/out" || fail "default window: unexpected summary: $(cat "$work/out")"
check_png window.png --start-ms 40 --span-ms 25 "$work/trace.json"
check_png lanes.png --max-lanes 4 --span-ms 500 "$work/trace.json"
grep -q "^.*: 4 lanes" "$work/out" || fail "--max-lanes 4: unexpected summary: $(cat "$work/out")"
check_png bare.png "$work/bare.json"
check_png cut.png "$work/cut.json"
# Default output: next to the trace, with .png.
"$py" "$script" "$work/bare.json" >/dev/null 2>&1
[[ -s $work/bare.png ]] || fail "no default output $work/bare.png"

# expect_error WHAT FILE ARGS...: the script must fail with a message naming FILE, no traceback.
expect_error() {
  local what=$1 file=$2
  shift 2
  if "$py" "$script" -o "$work/bad.png" "$@" "$file" >"$work/out" 2>"$work/err"; then
    fail "$what: exit status 0"
  elif grep -q Traceback "$work/err"; then
    fail "$what: traceback on stderr: $(cat "$work/err")"
  elif ! grep -qF "plot_timeline.py: $file" "$work/err"; then
    fail "$what: no message naming $file on stderr: $(cat "$work/err")"
  fi
}
printf '{"traceEvents": [{"ph": "X", "name": "ALLREDUCE", "ts": 1,' >"$work/malformed.json"
expect_error "malformed JSON" "$work/malformed.json"
grep -q "not valid JSON" "$work/err" || fail "malformed JSON: unclear message: $(cat "$work/err")"
echo '{"traceEvents": [{"ph": "M", "name": "thread_name", "args": {"name": "x"}}]}' >"$work/empty.json"
expect_error "no duration events" "$work/empty.json"
echo '{"traceEvents": [{"ph": "X", "name": "QUEUE", "ts": "soon", "dur": 3}]}' >"$work/badts.json"
expect_error "bad ts" "$work/badts.json"
echo '{"events": []}' >"$work/nolist.json"
expect_error "no traceEvents" "$work/nolist.json"
expect_error "missing file" "$work/absent.json"
"$py" "$script" --span-ms 0 "$work/trace.json" >/dev/null 2>&1
(($? == 2)) || fail "--span-ms 0: expected exit status 2"

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: plot_timeline.py"
