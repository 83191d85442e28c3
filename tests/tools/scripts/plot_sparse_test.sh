#!/usr/bin/env bash
# tools/plot_sparse.py on made-up sparse_study.sh output: two sections with rank prefixes, two
# types. Checks that it writes a PNG with one panel per section, and that text with no rows, a
# row reporting wrong values, and a type no row has fail with a message, not a traceback.
# Usage: plot_sparse_test.sh [PLOT_SPARSE_PY]. Without python3-matplotlib it exits 77 (skipped).
set -u
here=$(cd "$(dirname "$0")" && pwd)
script=${1:-$here/../../../tools/plot_sparse.py}
py=/usr/bin/python3
if ! "$py" -c "import matplotlib" 2>/dev/null; then
  echo "SKIPPED: python3-matplotlib is not installed"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

row() {  # row DENSITY TYPE ALGORITHM FORM TIME WRONG
  printf '[0]    %s      1000      2000   %s  sum  %-40s %s %12s %12s      1.00 %7s\n' "$1" "$2" "$3" "$4" "$5" 9000.0 "$6"
}
{
  echo "## 4x1 (hosts x ranks), links at 1gbit"
  echo "[0] # tutti-bench: sparse_allreduce, 4 ranks"
  for d in 0.0010 0.0100 0.1000; do
    for t in f32 f64; do
      row $d $t "automatic(allgather)" sparse 100.5 0
      row $d $t allgather sparse 100.5 0
      row $d $t ssar_recursive_doubling sparse 150.0 0
      row $d $t dense_allreduce dense 9000.0 0
      row $d $t densify+allreduce dense 9500.0 0
    done
  done
  echo
  echo "## 2x2 (hosts x ranks), links at 1gbit"
  for d in 0.0010 0.5000; do row $d f32 "automatic(dense_allreduce)" dense 700.0 0; row $d f32 dense_allreduce dense 650.0 0; done
} >"$work/study.txt"

expect_ok() {  # expect_ok NAME PANELS ARGS...
  local name=$1 panels=$2 out
  shift 2
  if ! out=$("$py" "$script" "$@" 2>&1); then
    fail "$name: exited non-zero: $out"
  elif [[ $out != *"($panels panel(s))"* ]]; then
    fail "$name: expected $panels panel(s): $out"
  else
    echo "ok: $name"
  fi
}
expect_ok "two sections" 2 "$work/study.txt" --out "$work/a.png"
[[ $(head -c 8 "$work/a.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "a.png is not a PNG"
expect_ok "f64 rows of the first section" 1 <(sed '/^## 2x2/,$d' "$work/study.txt") --out "$work/b.png" --type f64

expect_error() {  # expect_error NAME TEXT ARGS...
  local name=$1 text=$2 out status=0
  shift 2
  out=$("$py" "$script" "$@" 2>&1) || status=$?
  if [[ $status -eq 0 || $out == *Traceback* || $out != *"$text"* ]]; then
    fail "$name: status $status, output: $out"
  else
    echo "ok: $name refused"
  fi
}
echo "nothing here" >"$work/empty.txt"
expect_error "no rows" "no tutti-bench sparse_allreduce rows" "$work/empty.txt" --out "$work/c.png"
{ echo "## x"; row 0.0100 f32 densify+allreduce dense 10.0 3; } >"$work/wrong.txt"
expect_error "wrong values" "reports 3 wrong values" "$work/wrong.txt" --out "$work/d.png"
expect_error "absent type" "no rows of type i32" "$work/study.txt" --out "$work/e.png" --type i32
expect_error "missing file" "No such file" "$work/none.txt"
echo "plot_sparse_test: $failures failed"
((failures == 0))
