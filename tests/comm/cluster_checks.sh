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
