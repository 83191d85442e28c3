# What the emulated cluster's tests (cluster_test.sh, cluster_mpirun_test.sh) check alike. Source
# it once $out names the file that holds cluster.sh's output; each check that fails prints
# "FAIL: ..." and sets failed=1.
failed=0
expect() {  # what, extended regular expression
  grep -qE "$2" "$out" || { echo "FAIL: $1 (no line matching '$2')"; failed=1; }
}
links_carried() {  # MIN_BYTES: both hosts' links (cluster.sh's closing lines) sent and received at least that
  local h line sent received
  for h in 0 1; do
    line=$(grep -E "^cluster.sh: host$h link: sent [0-9]+ bytes, received [0-9]+ bytes$" "$out")
    read -r sent received < <(sed -E 's/.*sent ([0-9]+) bytes, received ([0-9]+) bytes/\1 \2/' <<<"$line")
    if [[ -z ${sent:-} ]] || ((sent < $1 || received < $1)); then
      echo "FAIL: host$h's link carried too little: '${line:-no line}'"
      failed=1
    fi
  done
}
link_probed() {  # RANKS MIN_GBIT MAX_GBIT: every rank logged the same link probe, rank 0 to rank 2, within the rates
  local lines distinct rate
  lines=$(grep -E '^\[[0-9]+\] tutti\[[0-9]+\] INFO: init: link probe, rank 0 to rank 2: ' "$out" | sed -E 's/^\[[0-9]+\] tutti\[[0-9]+\] //')
  if [[ $(grep -c . <<<"$lines") -ne $1 ]]; then
    echo "FAIL: expected the link probe's line on each of $1 ranks, got: '${lines:-none}'"
    failed=1
    return
  fi
  distinct=$(sort -u <<<"$lines" | grep -c .)
  ((distinct == 1)) || { echo "FAIL: the ranks installed different link costs: $lines"; failed=1; }
  rate=$(head -n1 <<<"$lines" | sed -nE 's/.*\(([0-9.e+-]+) Gbit\/s\).*/\1/p')
  awk -v r="${rate:-0}" -v lo="$2" -v hi="$3" 'BEGIN { exit !(r >= lo && r <= hi) }' ||
    { echo "FAIL: the link probe measured '${rate:-nothing}' Gbit/s, not $2 to $3: $(head -n1 <<<"$lines")"; failed=1; }
}
