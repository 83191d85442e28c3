#!/usr/bin/env bash
# tutti-sim's command line: bad flags and inputs exit 2 naming the problem; --config and
# --opt=value give what the plain flags give; a VGG-16 step at 16,384 ranks (4 per host)
# completes and its row holds together (step >= compute, exposed = step - compute, speedups at
# most ideal); --compare prints the three policies; the timeline is a complete JSON array with
# the phases of a real run.
# Usage: sim_cli_test.sh TUTTI_SIM PROFILES_DIR
set -u
sim=${1:?usage: sim_cli_test.sh TUTTI_SIM PROFILES_DIR}
profiles=${2:?usage: sim_cli_test.sh TUTTI_SIM PROFILES_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

expect_usage() {  # expect_usage PATTERN ARGS...
  local pattern=$1
  shift
  "$sim" "$@" >"$work/out" 2>"$work/err"
  local status=$?
  [[ $status == 2 ]] || fail "tutti-sim $* exited $status, expected 2"
  grep -q -- "$pattern" "$work/err" || fail "tutti-sim $*: no \"$pattern\" in: $(head -2 "$work/err")"
}
expect_usage "--profile is required" --ranks 4
expect_usage "unknown option --bogus" --profile "$profiles/vgg16.profile" --bogus
expect_usage "cannot open profile" --profile "$work/none.profile"
expect_usage "--ranks-per-host 3 does not divide 8" --profile "$profiles/vgg16.profile" --ranks 8 --ranks-per-host 3
expect_usage "--straggler: FACTOR must be >= 1" --profile "$profiles/vgg16.profile" --straggler 1:0.5
expect_usage "--overlap: expected on or off" --profile "$profiles/vgg16.profile" --overlap maybe
expect_usage "--fusion-threshold: expected a size" --profile "$profiles/vgg16.profile" --fusion-threshold 1.5M
expect_usage "--first-bucket: '17179869184G' is too large" --profile "$profiles/vgg16.profile" --first-bucket=17179869184G
printf 'profile = "%s"\nfusion-threshold = "1KiB"\nbogus = 1\n' "$profiles/vgg16.profile" >"$work/bad.toml"
expect_usage "--config: unknown key 'bogus'" --config "$work/bad.toml"
printf 'alpha 1e-6\nlatency 3\n' >"$work/bad.network"
expect_usage "bad.network:2: unknown key" --profile "$profiles/vgg16.profile" --network "$work/bad.network"

start=$(date +%s)
timeout 120 "$sim" --profile "$profiles/vgg16.profile" --network "$profiles/aries.network" --ranks 1,16384 \
  --ranks-per-host 4 --json >"$work/big" 2>"$work/err" || fail "16,384 ranks: exit $? ($(cat "$work/err"))"
echo "a VGG-16 step at 16,384 ranks simulated in $(($(date +%s) - start)) s"
/usr/bin/python3 - "$work/big" <<'PY' || fail "16,384-rank rows do not hold together"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["ranks"] for r in rows] == [1, 16384], rows
for r in rows:
    assert r["step_s"] >= r["compute_s"] - 1e-12, r
    assert abs(r["exposed_s"] - (r["step_s"] - r["compute_s"])) < 1e-6 * r["step_s"], r  # printed to 9 digits
    assert 0 <= r["hidden"] <= 1, r
    assert 0 < r["speedup"] <= r["ranks"] * (1 + 1e-9), r
assert rows[0]["speedup"] == 1 and rows[1]["allreduce_s"] > 0 and rows[1]["ranks_per_host"] == 4, rows
PY

# --opt=value and --config give what the plain flags give, the command line winning over the file.
"$sim" --profile "$profiles/resnet50.profile" --ranks 1,8 --ranks-per-host 2 --fusion-threshold 1M --json \
  >"$work/plain" 2>"$work/err" || fail "plain flags: exit $? ($(cat "$work/err"))"
printf 'profile = "%s"\nranks = "1,8"\nranks-per-host = 4\nfusion-threshold = "64M"\njson = true\n' \
  "$profiles/resnet50.profile" >"$work/run.toml"
"$sim" --config "$work/run.toml" --ranks-per-host=2 --fusion-threshold=1MiB >"$work/config" 2>"$work/err" ||
  fail "--config: exit $? ($(cat "$work/err"))"
cmp -s "$work/plain" "$work/config" || fail "--config with --opt=value overrides differs from the plain flags"
[[ $(wc -l <"$work/plain") == 2 ]] || fail "plain flags: not 2 rows"

"$sim" --profile "$profiles/resnet50.profile" --ranks 8 --ranks-per-host 2 --compare --timeline "$work/t.json" \
  >"$work/compare" 2>"$work/err" || fail "--compare: exit $? ($(cat "$work/err"))"
for policy in "(a) after backward" "(b) overlapped" "(c) overlapped+fusion"; do
  grep -qF "$policy" "$work/compare" || fail "--compare printed no row for $policy"
done
/usr/bin/python3 - "$work/t.json" <<'PY' || fail "the timeline is not a complete trace with the run's phases"
import json, sys
events = json.load(open(sys.argv[1]))
names = {e.get("name") for e in events}
for phase in ("FORWARD", "BACKWARD", "OPTIMIZER", "NEGOTIATE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER"):
    assert phase in names, phase
PY
((failures == 0)) && echo "sim_cli: all checks passed"
exit $((failures > 0))
