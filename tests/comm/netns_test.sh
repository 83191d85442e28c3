#!/usr/bin/env bash
# Ranks on two emulated hosts: two network namespaces joined by a veth pair (198.18.0.0/24), TCP
# between them, a tcp:// store hosted by rank 0, TUTTI_HOST naming the hosts so that the forced
# hierarchical allreduce runs across them. Usage: netns_test.sh MP_COLLECTIVES
# Needs root and iproute2; without them it says so and exits 77 (ctest shows it as skipped).
set -u
program=$1
if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "SKIPPED: needs root and iproute2 to create network namespaces"
  exit 77
fi
a=tutti-a-$$ b=tutti-b-$$ va=tva$$ vb=tvb$$
work=$(mktemp -d)
cleanup() {
  for ns in $a $b; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
if ! ip netns add $a || ! ip netns add $b; then
  echo "SKIPPED: cannot create network namespaces here"
  exit 77
fi
ip link add $va type veth peer name $vb &&
  ip link set $va netns $a && ip link set $vb netns $b &&
  ip -n $a addr add 198.18.0.1/24 dev $va && ip -n $b addr add 198.18.0.2/24 dev $vb &&
  ip -n $a link set $va up && ip -n $b link set $vb up &&
  ip -n $a link set lo up && ip -n $b link set lo up || { echo "FAIL: could not set up the veth pair"; exit 1; }
token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
pids=()
for r in 0 1 2 3; do
  if ((r < 2)); then ns=$a address=198.18.0.1 host=host-a; else ns=$b address=198.18.0.2 host=host-b; fi
  ip netns exec "$ns" env TUTTI_RANK=$r TUTTI_SIZE=4 TUTTI_LOCAL_RANK=$((r % 2)) TUTTI_LOCAL_SIZE=2 \
    TUTTI_STORE=tcp://198.18.0.1:29517 TUTTI_TOKEN="$token" TUTTI_JOB_ID=netns$$ TUTTI_TRANSPORT=tcp \
    TUTTI_TCP_HOST=$address TUTTI_HOST=$host TUTTI_TIMEOUT_MS=60000 TUTTI_ALGO=allreduce:hierarchical \
    timeout -s KILL 240 "$program" sweep >"$work/out$r" 2>&1 &
  pids+=($!)
done
failed=0
for r in 0 1 2 3; do
  wait "${pids[$r]}" || { echo "FAIL: rank $r exited with $?"; sed "s/^/  [$r] /" "$work/out$r"; failed=1; }
done
summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$work/out0")
echo "two hosts over TCP (hierarchical allreduce): ${summary:-no summary}"
[[ $failed -eq 0 && $summary == *" passed, 0 failed" ]]
