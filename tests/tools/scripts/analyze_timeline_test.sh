#!/usr/bin/env bash
# tools/analyze_timeline.py.
#   analyze_timeline_test.sh ANALYZE_TIMELINE_PY
#     Hand-made traces with exact expected figures: one rank, two steps and a third cut short (X
#     events and a B/E pair, a fused allreduce on two lanes, a file without its closing bracket);
#     a straggler against the other rank and a baseline run, read through "{rank}" paths and
#     from one file holding both ranks; bad input (missing file, no OPTIMIZER, unknown straggler
#     rank) exits 2 naming the file or flag.
#   analyze_timeline_test.sh ANALYZE_TIMELINE_PY TUTTI_RUN TUTTI_TRAIN [DATA_DIR]
#     A real 2-rank tutti-train timeline, one file per rank: every rank's steps are found, each
#     with a backward, an optimizer after it and allreduces; the straggler report runs, and the
#     straggler's compute on the timeline (--straggler 1:3) is over twice what its --profile
#     measured without the injected waits, over the same steps. Checks the structure, never a
#     speed. Exits 77 (skipped) without the Fashion-MNIST files.
set -u
script=$1
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

# A rank's steps, as (fwd, bwd, opt, [(tensor, negotiate, allreduce)]) in microseconds.
"$py" - "$work" <<'EOF'
import json, sys
work = sys.argv[1]

def meta(pid, lanes):
    out = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {pid}"}}]
    for tid, lane in enumerate(lanes):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}})
    return out

def x(pid, tid, name, start, end):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": start, "dur": end - start, "args": {}}

lanes = ["step", "a", "b", "c"]
ev = meta(0, lanes)
# Step 0 at 1000 us: a reduced during backward, b and c fused after it.
ev += [x(0, 0, "FORWARD", 1000, 3000), x(0, 0, "BACKWARD", 3000, 9000), x(0, 0, "OPTIMIZER", 12000, 13000),
       x(0, 1, "NEGOTIATE", 4000, 4500), x(0, 1, "ALLREDUCE", 5000, 7000),
       x(0, 2, "NEGOTIATE", 8000, 8500), x(0, 2, "ALLREDUCE", 9000, 11000), x(0, 3, "ALLREDUCE", 9000, 11000)]
# Step 1 at 14000 us, its optimizer as a B/E pair; then a step cut short (no optimizer).
ev += [x(0, 0, "FORWARD", 14000, 15000), x(0, 0, "BACKWARD", 15000, 20000),
       {"ph": "B", "name": "OPTIMIZER", "pid": 0, "tid": 0, "ts": 20500},
       {"ph": "E", "name": "OPTIMIZER", "pid": 0, "tid": 0, "ts": 21000},
       x(0, 1, "NEGOTIATE", 15500, 16000), x(0, 1, "ALLREDUCE", 16000, 17000),
       x(0, 0, "FORWARD", 22000, 23000)]
with open(f"{work}/one.json", "w") as f:  # as a timeline being written: no closing bracket
    f.write("[\n" + ",\n".join(json.dumps(e) for e in ev) + ",\n")

# Five steps per rank; each step (forward, backward, wait, optimizer) in ms, then a 1 ms gap.
# Baseline: rank 0 2, 6, 3, 1 and rank 1 2, 4, 5, 1: period 13. Straggled: rank 1 computes 3 + 8
# + 2 = 13 ms (4 more than rank 0) and waits 0, but in step 1 its backward takes 20 ms more; rank
# 0 waits 4, and 24 in step 1. Means over the steps: delay against rank 0 (4 * 4 + 24) / 5 = 8,
# against rank 1's own 7 ms in the baseline 17 - 7 = 10; period (3 * 14 + 34) / 4 = 19, 6 more
# than the baseline: 40% of the delay hidden (medians would say 4, 14 and 75%); rank 1's wait fell
# from 5 to 0 ms: 50% of the delay went into it.
def steps(pid, shapes):
    out = meta(pid, ["step", "a"])
    t = 1000
    for fwd, bwd, wait, opt in shapes:
        b = t + fwd + bwd
        out += [x(pid, 0, "FORWARD", t, t + fwd), x(pid, 0, "BACKWARD", t + fwd, b),
                x(pid, 0, "OPTIMIZER", b + wait, b + wait + opt), x(pid, 1, "ALLREDUCE", b - 1000, b + wait)]
        t = b + wait + opt + 1000
    return out

base = [(2000, 6000, 3000, 1000)] * 5
bump = lambda shape, bwd, wait: [(f, b + (bwd if k == 1 else 0), w + (wait if k == 1 else 0), o)
                                 for k, (f, b, w, o) in enumerate([shape] * 5)]
runs = {"base": [base, [(2000, 4000, 5000, 1000)] * 5],
        "slow": [bump((2000, 6000, 4000, 1000), 0, 20000), bump((3000, 8000, 0, 2000), 20000, 0)]}
for run, ranks in runs.items():
    for pid, shapes in enumerate(ranks):
        with open(f"{work}/{run}.{pid}.json", "w") as f:
            json.dump({"traceEvents": steps(pid, shapes)}, f)
# Both straggled ranks in one file (one pid each), as a simulator may write them.
with open(f"{work}/slow.both.json", "w") as f:
    json.dump(steps(0, runs["slow"][0]) + steps(1, runs["slow"][1]), f)
with open(f"{work}/noopt.json", "w") as f:
    json.dump([x(0, 0, "FORWARD", 0, 10), x(0, 0, "BACKWARD", 10, 20)], f)
EOF

case_steps() {
  "$py" "$script" --json "$work/one.json" >"$work/one.out" 2>"$work/err" || { fail steps "exit $? $(cat "$work/err")"; return; }
  local diff
  diff=$("$py" - "$work/one.out" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
expected = [
    {"step": 0, "start_ms": 1.0, "step_ms": 12.0, "compute_ms": 9.0, "fwd": [0.0, 2.0], "bwd": [2.0, 8.0],
     "neg": [3.0, 7.5], "comm": [4.0, 10.0], "opt": [11.0, 12.0], "busy_ms": 4.0, "overlap": 0.5,
     "exposed_ms": 3.0, "exposed_comm_ms": 2.0, "free_ms": 8.0, "longest_free_ms": 4.0, "free_windows": 3,
     "gap_ms": 1.0},
    {"step": 1, "start_ms": 14.0, "step_ms": 7.0, "compute_ms": 6.5, "fwd": [0.0, 1.0], "bwd": [1.0, 6.0],
     "neg": [1.5, 2.0], "comm": [2.0, 3.0], "opt": [6.5, 7.0], "busy_ms": 1.0, "overlap": 1.0,
     "exposed_ms": 0.5, "exposed_comm_ms": 0.0, "free_ms": 6.0, "longest_free_ms": 4.0, "free_windows": 2,
     "gap_ms": 1.0}]
summary = {"steps": 2, "step_ms": 9.5, "compute_ms": 7.75, "busy_ms": 2.5, "overlap": 0.75, "exposed_ms": 1.75,
           "exposed_comm_ms": 1.0, "free_ms": 7.0, "longest_free_ms": 4.0, "gap_ms": 1.0, "period_ms": 13.0}
got = r["ranks"]["0"]
bad = [f"step {e['step']} {k}: {got['steps'][i].get(k)} != {v}" for i, e in enumerate(expected)
       for k, v in e.items() if len(got["steps"]) > i and got["steps"][i].get(k) != v]
bad += [f"summary {k}: {got['summary'].get(k)} != {v}" for k, v in summary.items() if got["summary"].get(k) != v]
if len(got["steps"]) != 2:
    bad.append(f"{len(got['steps'])} steps, expected 2 (the third has no OPTIMIZER)")
print("; ".join(bad))
EOF
)
  [[ -z $diff ]] || { fail steps "$diff"; return; }
  # --skip leaves out the first step; the table shows the rows and the medians.
  "$py" "$script" --skip 1 "$work/one.json" >"$work/table" || { fail steps "table: exit $?"; return; }
  grep -q '^rank 0 (.*one.json): 1 steps' "$work/table" && grep -qE '^ +1 +0\.00-1\.00 +1\.00-6\.00 ' "$work/table" &&
    grep -q 'median: step 7.00 ms' "$work/table" || { fail steps "table: $(cat "$work/table")"; return; }
  ok steps
}

case_straggler() {
  "$py" "$script" --json --straggler 1 --baseline "$work/base.{rank}.json" "$work/slow.{rank}.json" \
    >"$work/s.out" 2>"$work/err" || { fail straggler "exit $? $(cat "$work/err")"; return; }
  local diff
  diff=$("$py" - "$work/s.out" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
expected = {"rank": 1, "steps": 5, "delay_vs_others_ms": 8.0, "delay_ms": 10.0, "straggler_exposed_ms": 0.0,
            "others_exposed_ms": 8.0, "period_ms": 19.0, "baseline_period_ms": 13.0, "baseline_exposed_ms": 4.0,
            "increase_ms": 6.0, "hidden": 0.4, "baseline_straggler_exposed_ms": 5.0, "hidden_in_wait": 0.5}
s = r.get("straggler", {})
bad = [f"{k}: {s.get(k)} != {v}" for k, v in expected.items() if s.get(k) != v]
if sorted(r["ranks"]) != ["0", "1"]:
    bad.append(f"ranks {sorted(r['ranks'])}")
print("; ".join(bad))
EOF
)
  [[ -z $diff ]] || { fail straggler "$diff"; return; }
  # The same ranks from one file.
  "$py" "$script" --json --straggler 1 --baseline "$work/base.{rank}.json" "$work/slow.both.json" >"$work/s2.out" ||
    { fail straggler "one file: exit $?"; return; }
  diff=$("$py" -c 'import json, sys
a, b = (json.load(open(p))["straggler"] for p in sys.argv[1:3])
print("" if a == b else f"{a} != {b}")' "$work/s.out" "$work/s2.out")
  [[ -z $diff ]] || { fail straggler "both ranks in one file: $diff"; return; }
  # Without a baseline: the delay against the other ranks, and no hidden share.
  "$py" "$script" --json --straggler 1 "$work/slow.{rank}.json" >"$work/s.out" || { fail straggler "exit $?"; return; }
  diff=$("$py" -c 'import json, sys
s = json.load(open(sys.argv[1]))["straggler"]
print("" if s["delay_ms"] == 8.0 and "hidden" not in s and "baseline_period_ms" not in s else s)' "$work/s.out")
  [[ -z $diff ]] || { fail straggler "without a baseline: $diff"; return; }
  "$py" "$script" --summary --straggler 1 --baseline "$work/base.{rank}.json" "$work/slow.{rank}.json" >"$work/table"
  grep -q 'hidden share of the delay 40.0%' "$work/table" || { fail straggler "table: $(cat "$work/table")"; return; }
  ok straggler
}

# Exit 2 and a message on stderr matching $2, for the arguments after it.
expect_error() {
  local name=$1 pattern=$2
  shift 2
  "$py" "$script" "$@" >"$work/out" 2>"$work/err"
  local status=$?
  [[ $status -eq 2 ]] || { fail "$name" "exit $status, expected 2"; return 1; }
  grep -q "$pattern" "$work/err" || { fail "$name" "stderr: $(cat "$work/err")"; return 1; }
  ! grep -q Traceback "$work/err" || { fail "$name" "a traceback"; return 1; }
}

case_bad_input() {
  expect_error missing "analyze_timeline.py: $work/none.json: " "$work/none.json" || return
  expect_error no-optimizer "noopt.json: rank 0 has no OPTIMIZER event" "$work/noopt.json" || return
  expect_error no-rank-files "$work/x.{rank}.json: no file matches" "$work/x.{rank}.json" || return
  expect_error unknown-straggler "\-\-straggler 5: no such rank" --straggler 5 "$work/slow.{rank}.json" || return
  expect_error lone-straggler "needs the traces of other ranks" --straggler 0 "$work/one.json" || return
  ok bad-input
}

case_real_run() {
  local run=$1 train=$2 data=${3:-/usr/share/datasets/fashion-mnist}
  timeout -s KILL 300 "$run" -n 2 "$train" --epochs 1 --train-samples 512 --test-samples 128 --batch-size 32 \
    --data "$data" --straggler 1:3 --timeline "$work/real.{rank}.json" --profile "$work/real.{rank}.txt" \
    >"$work/out" 2>&1 ||
    { fail real-run "tutti-train: exit $? $(tail -5 "$work/out")"; return; }
  "$py" "$script" --json --straggler 1 "$work/real.{rank}.json" >"$work/r.out" 2>"$work/err" ||
    { fail real-run "exit $? $(cat "$work/err")"; return; }
  local diff
  diff=$("$py" - "$work/r.out" "$work/real.1.txt" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
profile = [line.split() for line in open(sys.argv[2])]
bad = []
if sorted(r["ranks"]) != ["0", "1"]:
    bad.append(f"ranks {sorted(r['ranks'])}")
for rank, info in r["ranks"].items():
    steps = info["steps"]
    if len(steps) != 8:  # 512 samples / 2 ranks / 32
        bad.append(f"rank {rank}: {len(steps)} steps, expected 8")
    for s in steps:
        if not (s["fwd"] and s["bwd"] and s["opt"] and s["comm"]):
            bad.append(f"rank {rank} step {s['step']}: a phase is missing: {s}")
        # ts + dur rounds: an end and the next start may differ by a few ns
        elif not (s["fwd"][0] == 0 and s["fwd"][1] <= s["bwd"][0] + 1e-3 and s["bwd"][1] <= s["opt"][0] + 1e-3):
            bad.append(f"rank {rank} step {s['step']}: phases out of order: {s}")
        elif not (s["busy_ms"] > 0 and s["comm"][1] <= s["opt"][0] + 1e-3 and 0 <= s["overlap"] <= 1):
            bad.append(f"rank {rank} step {s['step']}: collectives not before the optimizer: {s}")
st = r.get("straggler", {})
if st.get("rank") != 1 or st.get("steps") != 8 or st.get("delay_ms") is None:
    bad.append(f"straggler report {st}")
# --straggler 1:3: rank 1 sleeps twice each compute segment after it. Its profile has the
# segments without the sleeps, averaged over the steps after tutti-train's 5 warm-up steps (5, 6
# and 7); the same steps' compute on the timeline holds the sleeps: about 3 times as long, and
# never less than the measured segments times 3 (a sleep never ends early).
else:
    base = sum(float(f[1]) for f in profile if f[0] in ("forward", "optimizer"))
    base += sum(float(f[4]) for f in profile if f[0] == "grad")
    steps = r["ranks"]["1"]["steps"][5:]
    stretched = sum(s["compute_ms"] for s in steps) / len(steps) / 1e3
    if not stretched > 2 * base:
        bad.append(f"rank 1's compute is not stretched: {stretched:.4f} s per step, its profile {base:.4f} s")
print("; ".join(bad))
EOF
)
  [[ -z $diff ]] || { fail real-run "$diff"; return; }
  ok real-run
}

if (($# >= 3)); then
  data=${4:-/usr/share/datasets/fashion-mnist}
  if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
    echo "skipped: no Fashion-MNIST in $data (install dataset-fashion-mnist)"
    exit 77
  fi
  case_real_run "$2" "$3" "$data"
else
  case_steps
  case_straggler
  case_bad_input
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
