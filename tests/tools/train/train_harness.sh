# Sourced by the tutti-train end-to-end tests (train_test.sh, train_profile_test.sh). The caller
# sets `run` (tutti-run), `train` (tutti-train) and `data` (the Fashion-MNIST directory); this
# makes $tmp (removed at exit), the counters `passed` and `failed`, and ok, fail and train_run,
# and exits 77 (skipped) when the data set is not installed.
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
  echo "skipped: no Fashion-MNIST in $data (install dataset-fashion-mnist)"
  exit 77
fi

ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() {
  echo "FAIL $1: $2"
  for f in "$tmp/out" "$tmp/err"; do [[ -s $f ]] && sed 's/^/    | /' "$f"; done
  failed=$((failed + 1))
}
# Runs tutti-train under tutti-run; output in $tmp/out and $tmp/err, status in $status.
train_run() {
  local ranks=$1
  shift
  timeout -s KILL 300 "$run" -n "$ranks" "$train" "$@" >"$tmp/out" 2>"$tmp/err"
  status=$?
}
