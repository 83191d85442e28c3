# Sourced by the scripts that run tutti-train beside tools/ddp_peer.py with one set of flags.
# train_flags DEFAULT-PAIRS... -- FLAGS...: sets the array `common` to the defaults (flag, value
# pairs) less those FLAGS name (as --flag or --flag=value), then FLAGS.
train_flags() {
  local defaults=() i arg keep
  while (($#)) && [[ $1 != -- ]]; do defaults+=("$1"); shift; done
  (($#)) && shift
  common=()
  for ((i = 0; i < ${#defaults[@]}; i += 2)); do
    keep=1
    for arg in "$@"; do [[ ${arg%%=*} == "${defaults[i]}" ]] && keep=0; done
    ((keep)) && common+=("${defaults[i]}" "${defaults[i + 1]}")
  done
  common+=("$@")
}
