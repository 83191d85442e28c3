#!/usr/bin/env bash
# An emulated cluster on this machine: H hosts, each a network namespace with one link into a
# bridge (which lives in a namespace of its own: nothing on the machine's own network changes),
# every link limited to RATE in both directions with tc tbf, R ranks of a Tutti job per host.
# Ranks of one host talk through shared memory, ranks of different hosts through TCP over their
# links. Runs COMMAND as every rank, prints its lines prefixed with "[RANK] ", and removes every
# namespace, link, process and shared-memory segment it made when it ends, however it ends.
#
#   scripts/cluster.sh [--hosts H] [--ranks R] [--rate RATE] [--timeout S] -- COMMAND [ARGS...]
#
#   --hosts H     emulated hosts, 1 to 200 (default 2)
#   --ranks R     ranks per host, 1 to 64 (default 2)
#   --rate RATE   each host's link rate as tc spells it: 1gbit, 10gbit, 25gbit, 500mbit...
#                 (default 1gbit); "unlimited" leaves the links as fast as veth goes
#   --timeout S   kills the job after S seconds (default 600); the ranks' operations time out
#                 after TUTTI_TIMEOUT_MS (default here 60000)
#   --grace S     seconds the other ranks get once one rank failed (default 10)
#   --elastic     an elastic job (TUTTI_ELASTIC=1 for every rank): a rank that fails does not end
#                 the others, and the exit status is 0 if some rank succeeded. Its store must
#                 outlive any rank: a file:// store in a private directory (the hosts share this
#                 machine's file system, as a cluster's shared file system), not rank 0's tcp://
#   --lose-host H:PATTERN  once a rank prints a line matching PATTERN (grep -E, on the "[RANK] "
#                 prefixed line), host H is lost: its link goes down at both ends, then its
#                 processes are killed, so that its peers see silence (no connection closes)
#   --mpirun      starts the job with Open MPI's mpirun instead, as on a cluster: mpirun runs in
#                 host 0, and its daemons are started in each host's namespace (an rsh agent that
#                 enters the namespace in place of ssh); MPI's own traffic takes vader within a host
#                 and tcp over the links. The ranks get TUTTI_HOST and TUTTI_TCP_HOST (no store:
#                 Tutti bootstraps through MPI), so Tutti and MPI cross the same links
#
# Host i (0-based) is named host<i> (TUTTI_HOST) at 198.18.0.<i+1>/24; rank i*R+j is its j-th
# rank. Rank 0 hosts the job's tcp:// store. The veth links have no added latency: tc netem is
# not available, so only the rate is emulated. Exit status: the first failing rank's, else 0;
# 77 with "SKIPPED: ..." where namespaces or tc cannot be used (not root, no iproute2, no tbf).
set -u

hosts=2 ranks=2 rate=1gbit limit=600 grace=10 elastic= lose_host= lose_pattern= mpirun=
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2; exit 2; }
while (($#)); do
  case $1 in
    --hosts) hosts=${2:-}; shift 2 ;;
    --ranks) ranks=${2:-}; shift 2 ;;
    --rate) rate=${2:-}; shift 2 ;;
    --timeout) limit=${2:-}; shift 2 ;;
    --grace) grace=${2:-}; shift 2 ;;
    --elastic) elastic=1; shift ;;
    --mpirun) mpirun=1; shift ;;
    --lose-host) lose_host=${2%%:*}; lose_pattern=${2#*:}; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "cluster.sh: unknown option '$1' (the command follows --)" >&2; usage ;;
  esac
done
(($# > 0)) || { echo "cluster.sh: missing COMMAND after --" >&2; usage; }
[[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 1 && hosts <= 200)) || { echo "cluster.sh: --hosts: 1 to 200, got '$hosts'" >&2; exit 2; }
[[ $ranks =~ ^[0-9]+$ ]] && ((ranks >= 1 && ranks <= 64)) || { echo "cluster.sh: --ranks: 1 to 64, got '$ranks'" >&2; exit 2; }
[[ $limit =~ ^[0-9]+$ ]] && ((limit >= 1)) || { echo "cluster.sh: --timeout: seconds, got '$limit'" >&2; exit 2; }
[[ $grace =~ ^[0-9]+$ ]] || { echo "cluster.sh: --grace: whole seconds, got '$grace'" >&2; exit 2; }
[[ -z $lose_host ]] || { [[ $lose_host =~ ^[0-9]+$ ]] && ((lose_host < hosts)) && [[ -n $lose_pattern ]]; } ||
  { echo "cluster.sh: --lose-host: HOST:PATTERN with HOST below --hosts, got '$lose_host:$lose_pattern'" >&2; exit 2; }
[[ -z $mpirun ]] || { [[ -z $elastic && -z $lose_host ]] ||
  { echo "cluster.sh: --mpirun takes neither --elastic nor --lose-host" >&2; exit 2; }; }
[[ $rate == unlimited || $rate =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] ||
  { echo "cluster.sh: --rate: e.g. 1gbit, 10gbit, 500mbit or unlimited, got '$rate'" >&2; exit 2; }

if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "SKIPPED: needs root, ip and tc (iproute2) to build the emulated cluster"
  exit 77
fi
if [[ -n $mpirun ]] && ! command -v mpirun >/dev/null; then
  echo "SKIPPED: --mpirun needs Open MPI's mpirun"
  exit 77
fi

# Unique per run (the pid), so that clusters built at once do not collide; interface names stay
# within the kernel's 15 characters.
id=$$
bridge_ns=tutti-cl$id-br
host_ns() { echo "tutti-cl$id-h$1"; }
job_id=cluster$id
work=$(mktemp -d)
made=()  # namespaces made so far

cleanup() {
  trap - EXIT INT TERM HUP
  for ns in "${made[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
  done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done  # takes its veth ends along
  rm -f /dev/shm/tutti-"$job_id"* 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "cluster.sh: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

skip() { echo "SKIPPED: $1"; exit 77; }
fail() { echo "cluster.sh: $1" >&2; exit 1; }

ip netns add "$bridge_ns" 2>/dev/null || skip "cannot create network namespaces here"
made+=("$bridge_ns")
ip -n "$bridge_ns" link set lo up &&
  ip -n "$bridge_ns" link add br$id type bridge &&
  ip -n "$bridge_ns" link set br$id up || fail "could not make the bridge"

# tbf's bucket: 1 ms at the rate (at least 128 KiB, so that one GSO segment always fits).
burst_of() {
  local bits
  bits=$(awk -v r="$1" 'BEGIN {
    n = r + 0; u = tolower(substr(r, length(n "") + 1));
    m = 1; if (u ~ /^k/) m = 1e3; else if (u ~ /^m/) m = 1e6; else if (u ~ /^g/) m = 1e9; else if (u ~ /^t/) m = 1e12;
    if (u ~ /bps$/) m *= 8;
    printf "%d", n * m }')
  local bytes=$((bits / 8 / 1000))
  echo $((bytes > 131072 ? bytes : 131072))
}
limit_link() {  # namespace, device
  [[ $rate == unlimited ]] && return 0
  tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$(burst_of "$rate")" latency 50ms
}

for ((i = 0; i < hosts; i++)); do
  ns=$(host_ns $i)
  ip netns add "$ns" || fail "could not make namespace $ns"
  made+=("$ns")
  inner=tc${i}h$id outer=tc${i}b$id
  ip -n "$bridge_ns" link add "$outer" type veth peer name "$inner" netns "$ns" &&
    ip -n "$bridge_ns" link set "$outer" master br$id up &&
    ip -n "$ns" link set lo up &&
    ip -n "$ns" addr add 198.18.0.$((i + 1))/24 dev "$inner" &&
    ip -n "$ns" link set "$inner" up || fail "could not link host $i to the bridge"
  if ! limit_link "$ns" "$inner" || ! limit_link "$bridge_ns" "$outer"; then
    ((i == 0)) && skip "tc cannot add a tbf qdisc here (rate '$rate')"
    fail "could not limit host $i's link to $rate"
  fi
done

size=$((hosts * ranks))
token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
store=tcp://198.18.0.1:29500
if [[ -n $elastic ]]; then
  mkdir -m 700 "$work/store"
  store=file://$work/store
fi
echo "cluster.sh: $hosts hosts x $ranks ranks, links at $rate$([[ $rate == unlimited ]] || echo " (tc tbf, both directions)"), $([[ -n $mpirun ]] && echo "under mpirun" || echo "store $store")" >&2

start_rank() {  # host, local index, command...
  local h=$1 j=$2 r=$(($1 * ranks + $2))
  shift 2
  {
    ip netns exec "$(host_ns $h)" env TUTTI_RANK=$r TUTTI_SIZE=$size TUTTI_LOCAL_RANK=$j \
      TUTTI_LOCAL_SIZE=$ranks TUTTI_STORE=$store TUTTI_TOKEN="$token" TUTTI_JOB_ID=$job_id \
      TUTTI_HOST=host$h TUTTI_TCP_HOST=198.18.0.$((h + 1)) TUTTI_TIMEOUT_MS="${TUTTI_TIMEOUT_MS:-60000}" \
      ${elastic:+TUTTI_ELASTIC=1} timeout -s KILL "$limit" "$@" </dev/null 2>&1
    echo $? >"$work/rc$r"
  } 2>/dev/null | sed -u "s/^/[$r] /" | tee -a "$work/output" &  # (stderr in the pipe; not the shell's "Killed")
}
lose() {  # host: its link down at both ends (nothing it sends leaves), then its processes killed
  ip -n "$(host_ns "$1")" link set "tc${1}h$id" down 2>/dev/null
  ip -n "$bridge_ns" link set "tc${1}b$id" down 2>/dev/null
  ip netns pids "$(host_ns "$1")" 2>/dev/null | xargs -r kill -9 2>/dev/null
  echo "cluster.sh: host$1 lost (its link down, its processes killed)" >&2
}
# Under mpirun: one mpirun in host 0's namespace; an rsh agent (called as AGENT [OPTIONS] HOST
# COMMAND, in place of ssh) starts each host's daemon in that host's namespace, with a host name of
# its own (a UTS namespace: Open MPI names its session directories and shared-memory files by host
# name, and two hosts' files must not meet) and the host's address, which the daemon's ranks
# inherit. The job's status is mpirun's, kept as rank 0's; each rank's lines get the "[RANK] "
# prefix from a wrapper that keeps the rank's status.
start_mpirun() {
  local agent=$work/agent hostfile=$work/hosts
  for ((i = 0; i < hosts; i++)); do echo "host$i slots=$ranks"; done >"$hostfile"
  cat >"$agent" <<AGENT
#!/usr/bin/env bash
while [[ \$1 == -* ]]; do shift; done
host=\$1; shift
i=\${host#host}
exec ip netns exec tutti-cl$id-h\$i unshare --uts env TUTTI_HOST=host\$i TUTTI_TCP_HOST=198.18.0.\$((i + 1)) \\
  sh -c "hostname host\$i && \$*"
AGENT
  chmod +x "$agent"
  local exports=() name
  export TUTTI_TIMEOUT_MS=${TUTTI_TIMEOUT_MS:-60000}
  for name in $(compgen -e); do [[ $name == TUTTI_* ]] && exports+=(-x "$name"); done
  {
    ip netns exec "$(host_ns 0)" timeout -s KILL "$limit" \
      mpirun --allow-run-as-root -np "$size" --hostfile "$hostfile" --mca plm_rsh_agent "$agent" \
      --mca plm_rsh_no_tree_spawn 1 --mca mpi_yield_when_idle 1 --mca btl self,vader,tcp --mca btl_tcp_if_include 198.18.0.0/24 \
      --mca oob_tcp_if_include 198.18.0.0/24 "${exports[@]}" \
      bash -c 'set -o pipefail; "$@" 2>&1 | sed -u "s/^/[$OMPI_COMM_WORLD_RANK] /"' rank "$@" </dev/null 2>&1
    echo $? >"$work/rc0"
  } 2>/dev/null | tee -a "$work/output" &
  for ((r = 1; r < size; r++)); do echo 0 >"$work/rc$r"; done
}
if [[ -n $mpirun ]]; then
  start_mpirun "$@"
else
  for ((i = 0; i < hosts; i++)); do
    for ((j = 0; j < ranks; j++)); do start_rank $i $j "$@"; done
  done
fi

# Waits for every rank; once one fails the others get the grace period, then are killed (not in
# an elastic job, whose status is 0 if some rank succeeded).
status=0 failed_at= succeeded=0
while :; do
  done_count=0
  for ((r = 0; r < size; r++)); do
    [[ -s $work/rc$r ]] || continue
    ((done_count++))
    [[ -e $work/seen$r ]] && continue
    : >"$work/seen$r"
    rc=$(<"$work/rc$r")
    ((rc == 0)) && { succeeded=1; continue; }
    echo "cluster.sh: rank $r exited with status $rc${elastic:+; the elastic job goes on without it}" >&2
    ((status == 0)) || continue
    status=$rc
    [[ -n $elastic ]] || failed_at=$SECONDS
  done
  ((done_count == size)) && break
  if [[ -n $lose_pattern ]] && grep -qE -- "$lose_pattern" "$work/output" 2>/dev/null; then
    lose "$lose_host"
    lose_pattern=
  fi
  if [[ -n $failed_at ]] && ((SECONDS - failed_at >= grace)); then
    echo "cluster.sh: killing the ranks still running $grace s after the failure" >&2
    for ((i = 0; i < hosts; i++)); do ip netns pids "$(host_ns $i)" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
    grace=1000000000  # once
  fi
  sleep 0.1
done
wait  # the output filters

# What crossed each link (bytes the host sent and received), for measuring against the rate.
for ((i = 0; i < hosts; i++)); do
  stats=/sys/class/net/tc${i}h$id/statistics
  read -r tx rx < <(ip netns exec "$(host_ns $i)" cat $stats/tx_bytes $stats/rx_bytes 2>/dev/null | tr '\n' ' ')
  echo "cluster.sh: host$i link: sent ${tx:-?} bytes, received ${rx:-?} bytes" >&2
done
[[ -n $elastic ]] && ((succeeded)) && status=0
exit "$status"
