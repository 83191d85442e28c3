#!/usr/bin/env bash
# hvd.elastic (elastic_test.py) under tutti-run -n 3 --elastic: the three ranks the job ends with
# (two survivors and the one that joined) each print their "done" line; the killed rank's is the
# only failure tutti-run reports.
#
#   elastic_test.sh TUTTI_RUN PYTHON
set -u
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout -s KILL 200 "$1" -n 3 --elastic "$2" "$(dirname "$0")/elastic_test.py" >"$out" 2>&1
status=$?
cat "$out"
[[ $status -eq 0 ]] || { echo "FAILED: tutti-run exited with $status"; exit 1; }
[[ $(grep -cE '^\[[0-9]\] done rank [0-2] of 3 generation 2 ' "$out") -eq 3 ]] ||
  { echo "FAILED: not 3 ranks done in generation 2"; exit 1; }
grep -qE '^\[3\] done rank 2 of 3 generation 2 joined True' "$out" || { echo "FAILED: the joiner did not finish"; exit 1; }
! grep -q 'Traceback' "$out" || { echo "FAILED: a rank raised"; exit 1; }
[[ $(grep -c 'tutti-run: rank [0-9] (pid [0-9]*)' "$out") -eq 1 ]] || { echo "FAILED: more than the killed rank failed"; exit 1; }
echo PASSED
