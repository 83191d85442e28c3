#!/usr/bin/env bash
# The cost of per-frame authentication over TCP: tutti-bench allreduce at p = 2 over loopback, the
# same binary with frame tags (TUTTI_TOKEN set) and without (TUTTI_INSECURE=1, no token),
# alternating round by round in one run, and the busbw ratio with / without per size (median of
# the rounds, with min and max). Usage: scripts/bench_frame_tags.sh [ROUNDS] (default 5).
# Builds nothing: run scripts/build.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
bench=build/tools/bench/tutti-bench
[[ -x $bench ]] || { echo "bench_frame_tags: $bench is missing; run scripts/build.sh first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One job of two ranks, started by hand (tutti-run always gives a token). $1: on|off.
run_job() {
  local tags=$1 out=$2 store job
  store=$(mktemp -d "$work/store.XXXX")
  # A store only this user can read makes rank 0 draw a token there (frame tags on) whatever
  # TUTTI_INSECURE says: the untagged runs need one that others can read.
  [[ $tags == off ]] && chmod 755 "$store"
  job="tags-$tags-$RANDOM$RANDOM"
  local token
  token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local pids=()
  for rank in 0 1; do
    (
      export TUTTI_RANK=$rank TUTTI_SIZE=2 TUTTI_LOCAL_RANK=$rank TUTTI_LOCAL_SIZE=2 TUTTI_JOB_ID=$job
      export TUTTI_STORE="file://$store" TUTTI_TRANSPORT=tcp TUTTI_TIMEOUT_MS=60000
      if [[ $tags == on ]]; then
        export TUTTI_TOKEN=$token
        unset TUTTI_INSECURE
      else
        unset TUTTI_TOKEN
        export TUTTI_INSECURE=1
      fi
      json=()
      [[ $rank -eq 0 ]] && json=(--json "$out")
      exec timeout 600 "$bench" -b 8 -e 16M -f 8 -c 1 --no-progress "${json[@]}"
    ) >"$work/log.$tags.$rank" 2>&1 &
    pids+=($!)
  done
  local status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  if [[ $status -ne 0 ]]; then
    echo "bench_frame_tags: a run with tags $tags failed:" >&2
    cat "$work/log.$tags."* >&2
    exit 1
  fi
}

for ((r = 0; r < rounds; ++r)); do
  run_job on "$work/on.$r.json"
  run_job off "$work/off.$r.json"
  echo "round $((r + 1))/$rounds done" >&2
done

python3 - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    return {row["bytes"]: row for row in json.load(open(path))["results"] if not row["in_place"]}
pairs = [(rows(f"{work}/on.{r}.json"), rows(f"{work}/off.{r}.json")) for r in range(rounds)]
print(f"allreduce f32, p = 2, tcp over loopback, {rounds} alternating rounds (medians)")
print(f"{'bytes':>10} {'tags us':>9} {'none us':>9} {'tags GB/s':>10} {'none GB/s':>10} "
      f"{'busbw ratio':>11} {'min':>6} {'max':>6}")
med = statistics.median
for size in sorted(pairs[0][0]):
    ratios = [on[size]["busbw_GBps"] / off[size]["busbw_GBps"] for on, off in pairs]
    print(f"{size:>10} {med(on[size]['time_us'] for on, _ in pairs):>9.1f} "
          f"{med(off[size]['time_us'] for _, off in pairs):>9.1f} "
          f"{med(on[size]['busbw_GBps'] for on, _ in pairs):>10.3f} "
          f"{med(off[size]['busbw_GBps'] for _, off in pairs):>10.3f} {med(ratios):>11.2f} "
          f"{min(ratios):>6.2f} {max(ratios):>6.2f}")
EOF
