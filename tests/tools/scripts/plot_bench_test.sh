#!/usr/bin/env bash
# tools/plot_bench.py on a made-up tutti-bench --json file: two collectives, three algorithms,
# peers on some rows, a ceiling. Checks that it writes valid PNGs (plain, --ratio, --in-place,
# --collective, two files) and that bad input fails with a message, not a traceback.
# Usage: plot_bench_test.sh [PLOT_BENCH_PY]. Without python3-matplotlib it exits 77 (skipped).
set -u
here=$(cd "$(dirname "$0")" && pwd)
script=${1:-$here/../../../tools/plot_bench.py}
py=/usr/bin/python3
if ! "$py" -c "import matplotlib" 2>/dev/null; then
  echo "SKIP: python3-matplotlib is not installed"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Sizes 4 B .. 256 MiB; mpi on every row of automatic and ring, gloo only on allreduce >= 1 KiB.
"$py" - "$work/sample.json" "$work/second.json" <<'EOF'
import json, sys
def rows(scale):
    out = []
    for coll, factor in (("allreduce", 1.5), ("allgather", 0.75)):
        for algo, speed in (("automatic", 1.0), ("ring", 0.6), ("direct", 0.9)):
            for in_place in (False, True):
                for k in range(2, 29):
                    n = 1 << k
                    t = 2.0 + n / (8e3 * speed * scale)
                    bw = n / t / 1e3 * factor
                    row = {"collective": coll, "algorithm": algo, "chosen": "direct", "type": "f32",
                           "op": "sum", "root": 0, "bytes": n, "count": n // 4,
                           "in_place": in_place, "time_us": t, "algbw_GBps": bw / factor,
                           "busbw_GBps": bw, "wrong": 0, "bound_fraction": 0.5,
                           "ceiling_busbw_GBps": 12.0 * factor}
                    peers = {}
                    if algo != "direct":
                        r = 1.5 * speed if n > 65536 else 0.8 + speed / 2
                        peers["mpi"] = {"time_us": r * t, "busbw_GBps": bw / r, "ratio": r}
                    if coll == "allreduce" and n >= 1024:
                        peers["gloo"] = {"time_us": 30 + 4 * t, "busbw_GBps": n / (30 + 4 * t) / 1e3}
                    if peers:
                        row["peers"] = peers
                    out.append(row)
    return out
doc = {"tool": "tutti-bench", "version": 1, "host": "node1", "ranks": 4, "transport": "shm",
       "launcher": "tutti-run", "command": "tutti-bench --json x", "results": rows(1.0),
       "ceiling": {"memory_bandwidth_GBps": 24.0, "latency_us": 0.4}}
json.dump(doc, open(sys.argv[1], "w"), indent=1)
second = {"tool": "tutti-bench", "version": 1, "label": "tcp", "ranks": 4, "transport": "tcp",
          "results": [{k: v for k, v in r.items() if k not in ("peers", "ceiling_busbw_GBps", "type")}
                      for r in rows(0.3)]}
json.dump(second, open(sys.argv[2], "w"))
EOF
[[ -s $work/sample.json ]] || { echo "FAIL: could not write the sample JSON"; exit 1; }

# check_png NAME ARGS...: runs the script with --out NAME and checks the PNG it writes.
check_png() {
  local png=$work/$1
  shift
  if ! "$py" "$script" --out "$png" "$@" >"$work/out" 2>"$work/err"; then
    fail "plot_bench.py $*: exit status $?: $(cat "$work/err")"
    return
  fi
  local magic size
  magic=$(head -c 8 "$png" 2>/dev/null | od -An -tx1 | tr -d ' \n')
  size=$(stat -c %s "$png" 2>/dev/null || echo 0)
  [[ $magic == 89504e470d0a1a0a ]] || fail "$png is not a PNG (magic $magic) for: $*"
  ((size > 10000)) || fail "$png is only $size bytes for: $*"
  [[ -s $work/err ]] && fail "plot_bench.py $* wrote to stderr: $(cat "$work/err")"
}
check_png plain.png "$work/sample.json"
check_png ratio.png --ratio "$work/sample.json"
check_png inplace.png --in-place "$work/sample.json"
check_png one.png --collective allgather --ratio "$work/sample.json"
check_png two.png --ratio "$work/sample.json" "$work/second.json"
# Only the required fields, odd peers: must still plot.
cat >"$work/sparse.json" <<'EOF'
{"results": [
 {"collective": "broadcast", "bytes": 8, "busbw_GBps": 0.001, "peers": null},
 {"collective": "broadcast", "bytes": 4096, "busbw_GBps": 0.5, "peers": {"mpi": "n/a"}},
 {"collective": "broadcast", "bytes": 1048576, "busbw_GBps": 4, "peers": {"mpi": {"ratio": 2}}},
 {"collective": "broadcast", "bytes": 1048576, "busbw_GBps": 0, "algorithm": "ring"},
 {"collective": "broadcast", "bytes": 64, "busbw_GBps": null, "op": "none", "algorithm": "ring"}]}
EOF
check_png sparse.png --ratio "$work/sparse.json"
# Default output: next to the first file, with .png.
"$py" "$script" "$work/second.json" >/dev/null 2>&1
[[ -s $work/second.png ]] || fail "no default output $work/second.png"

# expect_error WHAT ARGS...: the script must fail with a one-line reason and no traceback.
expect_error() {
  local what=$1
  shift
  if "$py" "$script" --out "$work/bad.png" "$@" >"$work/out" 2>"$work/err"; then
    fail "$what: exit status 0"
  elif grep -q Traceback "$work/err"; then
    fail "$what: traceback on stderr: $(cat "$work/err")"
  elif ! grep -q "plot_bench.py: " "$work/err"; then
    fail "$what: no message on stderr: $(cat "$work/err")"
  fi
}
printf '{"tool": "tutti-bench", "results": [' >"$work/malformed.json"
expect_error "malformed JSON" "$work/malformed.json"
grep -q "not valid JSON" "$work/err" || fail "malformed JSON: unclear message: $(cat "$work/err")"
echo '{"tool": "tutti-bench"}' >"$work/noresults.json"
expect_error "no results" "$work/noresults.json"
echo '{"results": [{"collective": "allreduce", "bytes": "big"}]}' >"$work/badrow.json"
expect_error "bad row" "$work/badrow.json"
expect_error "missing file" "$work/absent.json"
expect_error "unknown collective" --collective nosuch "$work/sample.json"

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: plot_bench.py"
