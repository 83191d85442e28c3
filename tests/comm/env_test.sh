#!/usr/bin/env bash
# Environment settings, through tutti-demo: TUTTI_ALGO forces and is logged by TUTTI_DEBUG=info;
# malformed or inapplicable values are errors that name the variable or the algorithm.
set -uo pipefail
demo=$1
failed=0
expect() {  # expect NAME EXIT-STATUS(0|nonzero) PATTERN -- env assignments...
  local name=$1 want=$2 pattern=$3
  shift 3
  local out status
  out=$(env "$@" "$demo" -n 3 --count 4096 --iters 1 2>&1)
  status=$?
  if [[ $want == 0 && $status -ne 0 ]] || [[ $want != 0 && $status -eq 0 ]]; then
    echo "FAIL $name: exit status $status"; echo "$out"; failed=1; return
  fi
  if ! grep -qE "$pattern" <<<"$out"; then
    echo "FAIL $name: output lacks /$pattern/"; echo "$out"; failed=1; return
  fi
  echo "ok   $name"
}
expect forced-ring-logged 0 'allreduce ~2\^14 B on 3 ranks: ring' TUTTI_ALGO=allreduce:ring TUTTI_DEBUG=info
expect forced-results-correct 0 'all results correct' TUTTI_ALGO=allreduce:rabenseifner,allgather:bruck,broadcast:ring
expect inapplicable 1 'algorithm bruck does not serve this collective' TUTTI_ALGO=allreduce:bruck
expect malformed 1 'TUTTI_ALGO: expected collective:algorithm' TUTTI_ALGO=ring
expect unknown-algorithm 1 "TUTTI_ALGO: unknown algorithm 'fastest'" TUTTI_ALGO=allreduce:fastest
expect bad-timeout 1 "TUTTI_TIMEOUT_MS: expected a non-negative integer, got 'soon'" TUTTI_TIMEOUT_MS=soon
exit $failed
