#!/usr/bin/env bash
# tutti-bench end to end: small checked sweeps under tutti-run (every collective, several types
# and ops, every algorithm, the Gloo peer, the ceiling, JSON), a deliberately corrupted result
# that must be counted, bad flags, --calibrate and --tune writing a tuning file that a later run
# loads, (when given mpirun) the MPI peer, and device mode: gpu::Communicator's collectives on the
# emulated device with the sync peer and the D2D copy columns, --kernels (the device's reduction
# kernel beside a D2D copy, on one rank), and --device cuda, which must run where there is a GPU
# and fail with one clear line where there is none. Every run is bounded by `timeout`; the
# temporary directory is removed at the end.
#
#   bench_test.sh PATH/TO/tutti-run PATH/TO/tutti-bench [PATH/TO/mpirun]
set -u
run=$1
bench=$2
mpirun=${3:-}
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok   $1"; passed=$((passed + 1)); }
fail() {
  echo "FAIL $1: $2"
  for f in "$tmp/out" "$tmp/err"; do [[ -s $f ]] && sed 's/^/    | /' "$f" | tail -40; done
  failed=$((failed + 1))
}
# bench N ARGS...: tutti-bench on N ranks under tutti-run, 120 s at most; status in $status.
bench() {
  local n=$1
  shift
  timeout -s KILL 120 "$run" -n "$n" --timeout-ms 60000 "$bench" --no-progress "$@" >"$tmp/out" 2>"$tmp/err"
  status=$?
}
# The data rows of the table: the lines that start with a size (rank 0's stdout, tagged or not).
rows() { sed -E 's/^\[[0-9]+\] ?//' "$tmp/out" | grep -E '^ +[0-9]+ +[0-9]+ ' || true; }
# Every row has the nccl-tests columns, numeric, with #wrong 0 in both forms (N/A allowed).
rows_parse_clean() {
  local n
  n=$(rows | wc -l)
  [[ $n -ge $1 ]] || { echo "only $n rows, expected at least $1"; return 1; }
  rows | awk '{
    if (NF < 13) { print "short row: " $0; bad = 1 }
    if ($9 != "0" && $9 != "N/A") { print "wrong out-of-place: " $0; bad = 1 }
    if ($13 != "0" && $13 != "N/A") { print "wrong in-place: " $0; bad = 1 }
    for (i = 6; i <= 8; i++) if ($i != "N/A" && $i !~ /^[0-9.]+$/) { print "not a number: " $0; bad = 1 }
  } END { exit bad }'
}

# 1. Every collective, two types, every op, checked, at 3 ranks (a non-power of two).
bench 3 --collective all -b 1 -e 64K -f 8 -n 2 -w 1 -d f32,i32 -o all -c 1 --json "$tmp/all.json"
if [[ $status -ne 0 ]]; then
  fail "all collectives" "exit status $status"
elif ! why=$(rows_parse_clean 80); then
  fail "all collectives" "$why"
elif ! grep -q "Out of bounds values : 0 OK" "$tmp/out" || ! grep -q "Avg bus bandwidth" "$tmp/out"; then
  fail "all collectives" "no footer"
elif ! /usr/bin/python3 - "$tmp/all.json" <<'EOF'; then
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["results"]
assert doc["ranks"] == 3 and doc["tool"] == "tutti-bench", doc
kinds = {r["collective"] for r in rows}
assert kinds == {"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "alltoall", "allgatherv",
                 "alltoallv", "gather", "scatter", "barrier", "sendrecv"}, kinds
assert sum(r["collective"] == "barrier" for r in rows) == 1, "a barrier has one row whatever the sizes and types"
assert all(r["wrong"] == 0 for r in rows)
assert all(r["time_us"] > 0 and r["busbw_GBps"] >= 0 for r in rows)
assert {r["op"] for r in rows if r["collective"] == "allreduce"} == {"sum", "prod", "min", "max", "avg"}
EOF
  fail "all collectives" "the JSON file does not hold the rows"
else
  ok "every collective, type and op checked at p=3, table and JSON parse"
fi

# groups_alike KIND: every algorithm group of KIND in the table has the same sizes, in ascending
# order (the groups are measured side by side and printed group by group).
groups_alike() {
  sed -E 's/^\[[0-9]+\] ?//' "$tmp/out" | awk -v kind="$1" '
    /^# Collective / { on = ($3 == kind ","); if (on) g++; next }
    on && /^ +[0-9]+ +[0-9]+ / { sizes[g] = sizes[g] " " $1 }
    END {
      if (g < 2) { print "fewer than two " kind " groups"; exit 1 }
      n = split(sizes[1], first, " ")
      for (i = 2; i <= n; i++) if (first[i] + 0 <= first[i - 1] + 0) { print "sizes not ascending:" sizes[1]; exit 1 }
      for (k = 2; k <= g; k++) if (sizes[k] != sizes[1]) { print "group " k " has sizes" sizes[k] ", group 1" sizes[1]; exit 1 }
    }'
}

# 2. Every algorithm, the Gloo peer and the ceiling, at 4 ranks; all types for allreduce.
bench 4 --collective allreduce,allgather,broadcast -b 4 -e 256K -f 16 -n 2 -w 1 --all-algorithms --peers gloo \
  --ceiling -c 1
if [[ $status -ne 0 ]]; then
  fail "all algorithms" "exit status $status"
elif ! why=$(rows_parse_clean 30); then
  fail "all algorithms" "$why"
elif [[ $(grep -c "# Collective allreduce, algorithm" "$tmp/out") -lt 4 ]]; then
  fail "all algorithms" "fewer than four allreduce algorithm groups"
elif ! why=$(groups_alike allreduce); then
  fail "all algorithms" "$why"
elif ! grep -q "Ceiling  *: memory bandwidth" "$tmp/out"; then
  fail "all algorithms" "no ceiling line"
elif ! grep -q "gloo" "$tmp/out"; then
  fail "all algorithms" "no gloo column or skip line"
else
  ok "every algorithm at p=4 with the Gloo peer and the ceiling"
fi
bench 2 -b 8 -e 4K -f 8 -n 2 -w 1 -d all -c 1
if [[ $status -ne 0 ]] || ! why=$(rows_parse_clean 40); then
  fail "all types" "status $status ${why:-}"
else
  ok "allreduce of every type at p=2"
fi

# 3. The check can fail: a damaged result is counted and the exit status says so.
bench 2 -b 64 -e 1K -f 4 -n 1 -w 0 -c 1 --corrupt-for-testing
if [[ $status -eq 0 ]] || ! grep -q "Out of bounds values : [1-9][0-9]* ERROR" "$tmp/out"; then
  fail "corrupted result" "status $status; the damage was not counted"
else
  ok "a corrupted result is counted as #wrong and fails the run"
fi
# Every row of the rooted and uneven collectives counts the damage (root 0 = the rank that damages).
bench 3 --collective gather,scatter,allgatherv,alltoallv -b 64 -e 1K -f 4 -n 1 -w 0 -c 1 --corrupt-for-testing
if [[ $status -eq 0 ]] || [[ $(rows | awk '$9 == "0"' | wc -l) -ne 0 ]] || [[ $(rows | wc -l) -ne 12 ]]; then
  fail "corrupted rooted and uneven results" "status $status; a row did not count the damage"
else
  ok "gather, scatter, allgatherv and alltoallv: a corrupted result is counted in every row"
fi

# 4. Bad flags are refused with a message naming the flag (tool_options_test checks the messages).
# refuse ARGS...: each argument (a command line) must exit 2 with a tutti-bench: message.
refuse() {
  local args
  for args in "$@"; do
    # shellcheck disable=SC2086
    timeout 20 "$bench" $args >"$tmp/out" 2>"$tmp/err"
    status=$?
    if [[ $status -ne 2 ]] || ! grep -q "tutti-bench: " "$tmp/err"; then
      fail "bad flags '$args'" "status $status"
    else
      ok "refuses '$args'"
    fi
  done
}
refuse "-b 1M -e 1K" "-d float17" "--collective allsum" "--peers nccl" "-n 0" "--frobnicate"
# The size syntax, and the short flags nccl-tests gives other meanings (-t threads, -a average mode).
refuse "-b 1.5K" "--maxbytes=64KB" "-e 17179869184G" "-t allreduce" "-a ring" "--collective"

# 5. --calibrate and --tune write a tuning file; a run that loads it checks clean.
bench 2 --calibrate --output "$tmp/tuning.json"
if [[ $status -ne 0 ]] || ! grep -q '"cost_model"' "$tmp/tuning.json" 2>/dev/null; then
  fail "calibrate" "status $status; no cost_model in the file"
else
  ok "--calibrate writes the cost model"
fi
bench 2 --tune --collective allreduce,allgather -b 8 -e 1M -f 32 -n 2 -w 1 --output "$tmp/tuning.json"
# Every size's line names the table's entry: a forced algorithm only where it beat automatic by
# 5% (automatic's time / its time >= 1.05 as printed), else automatic; the file holds exactly the
# forced ones, each range covering its size, and no entry covers a size automatic won.
if [[ $status -ne 0 ]] || ! /usr/bin/python3 - "$tmp/tuning.json" "$tmp/out" <<'EOF'; then
import json, re, sys
doc = json.load(open(sys.argv[1]))
entries = doc["entries"]
transport = next(iter(doc["cost_model"]))
assert transport in ("shm", "tcp"), doc["cost_model"]
assert all(e["ranks"] == 2 and e["min_bytes"] <= e["max_bytes"] and e["transport"] == transport for e in entries)
assert {e["collective"] for e in entries} <= {"allreduce", "allgather"}, entries
lines, collective = {}, None
for line in open(sys.argv[2]):
    line = re.sub(r"^\[[0-9]+\] ?", "", line)
    if m := re.match(r"# (\w+): per size", line):
        collective = m.group(1)
    elif m := re.match(r"^ +([0-9]+) +(\w+) +([0-9.]+)x ", line):
        lines.setdefault(collective, []).append((int(m.group(1)), m.group(2), float(m.group(3))))
assert set(lines) == {"allreduce", "allgather"} and all(len(v) >= 4 for v in lines.values()), lines
for c, sizes in lines.items():
    for size, entry, ratio in sizes:
        covering = [e["algorithm"] for e in entries if e["collective"] == c and e["min_bytes"] <= size <= e["max_bytes"]]
        if entry == "automatic":
            assert ratio <= 1.06 and covering == [], (c, size, ratio, covering)
        else:
            assert ratio >= 1.05 and covering == [entry], (c, size, entry, ratio, covering)
EOF
  fail "tune" "status $status; the tuning file or the printed choices are not as expected"
else
  ok "--tune writes an entry exactly where a forced algorithm beat automatic by 5%"
fi
TUTTI_TUNING_FILE="$tmp/tuning.json" bench 2 --collective allreduce,allgather -b 8 -e 1M -f 32 -n 2 -w 1 -c 1
if [[ $status -ne 0 ]] || ! rows_parse_clean 8 >/dev/null; then
  fail "tuned run" "status $status; no clean run with the tuning file"
else
  ok "a run with the tuning file --tune wrote checks clean"
fi
transport=$(/usr/bin/python3 -c 'import json, sys; print(next(iter(json.load(open(sys.argv[1]))["cost_model"])))' "$tmp/tuning.json")
cat >"$tmp/ring.json" <<EOF
{"version": 1, "entries": [{"collective": "allreduce", "transport": "$transport", "ranks": 2, "min_bytes": 0,
  "max_bytes": 18446744073709551615, "algorithm": "ring"}]}
EOF
TUTTI_TUNING_FILE="$tmp/ring.json" TUTTI_DEBUG=info bench 2 --collective allreduce -b 8 -e 64K -f 32 -n 2 -w 1 -c 1
if [[ $status -ne 0 ]] || ! rows_parse_clean 3 >/dev/null || ! grep -q "ring.*tuning file" "$tmp/err"; then
  fail "table run" "status $status; the table's entry was not chosen, or the run was not clean"
else
  ok "a run with TUTTI_TUNING_FILE chooses from the table and checks clean"
fi

# 6. Under mpirun: the MPI peer beside Tutti (Tutti over shared memory), and Gloo.
if [[ -n $mpirun ]]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -s KILL 120 "$mpirun" --oversubscribe -np 2 \
    "$bench" --no-progress --collective allreduce,reduce_scatter,alltoall,gather,scatter,allgatherv,alltoallv,barrier \
    -b 8 -e 64K -f 16 -n 2 -w 1 --peers mpi,gloo -c 1 --json "$tmp/mpi.json" \
    >"$tmp/out" 2>"$tmp/err"
  status=$?
  # (The exit status also counts the peers' wrong results: MPI's v-forms are checked like Tutti's.)
  if [[ $status -ne 0 ]] || ! rows_parse_clean 22 >/dev/null; then
    fail "mpirun" "status $status"
  elif ! grep -q "mpi (same run)" "$tmp/out" || grep -q "mpi peer skipped" "$tmp/out" ||
    [[ $(rows | awk '$15 == "-"' | wc -l) -ne 0 ]]; then
    fail "mpirun" "no MPI columns, or a row without MPI's time"
  elif ! grep -q "over shm" "$tmp/out"; then
    fail "mpirun" "Tutti did not run over shared memory"
  else
    ok "under mpirun with the MPI and Gloo peers"
  fi
  # The ratio matrix (scripts/bench.sh's table): a row per collective, a column per size, each cell
  # the JSON's MPI time / Tutti time (the same file twice: the median of two equal runs).
  table=$(/usr/bin/python3 "$(dirname "$0")/../../../tools/bench_table.py" matrix mpi "$tmp/mpi.json" "$tmp/mpi.json")
  if ! /usr/bin/python3 - "$tmp/mpi.json" "$table" <<'EOF'; then
import json, sys
doc, table = json.load(open(sys.argv[1])), sys.argv[2].splitlines()
rows = [r for r in doc["results"] if r["in_place"] == (r["collective"] == "broadcast") and "mpi" in r.get("peers", {})]
kinds = sorted({r["collective"] for r in rows})
assert len(table) == 2 + len(kinds), table
for line, kind in zip(table[2:], kinds):
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == kind, (cells, kind)
    want = [f"{r['peers']['mpi']['ratio']:.2f} ({r['peers']['mpi']['ratio']:.2f}–{r['peers']['mpi']['ratio']:.2f})"
            for r in rows if r["collective"] == kind]
    assert [c for c in cells[1:] if c != "-"] == want, (cells, want)
EOF
    fail "bench_table.py matrix" "the table does not hold the JSON's ratios: $table"
  else
    ok "bench_table.py matrix: a row per collective with the MPI/Tutti ratios of the JSON"
  fi
  # The in-place forms beside MPI_IN_PLACE (allreduce, alltoall; checked clean with -c 1), none
  # for reduce_scatter (MPI's in-place result lies elsewhere), and their own matrix.
  table=$(/usr/bin/python3 "$(dirname "$0")/../../../tools/bench_table.py" matrix-in-place mpi "$tmp/mpi.json")
  if ! /usr/bin/python3 - "$tmp/mpi.json" "$table" <<'EOF'; then
import json, sys
doc, table = json.load(open(sys.argv[1])), sys.argv[2].splitlines()
in_place = [r for r in doc["results"] if r["in_place"]]
with_mpi = [r for r in in_place if "mpi" in r.get("peers", {})]
assert {r["collective"] for r in with_mpi} == {"allreduce", "alltoall"}, sorted({r["collective"] for r in with_mpi})
assert all(r["peers"]["mpi"]["wrong"] == 0 and r["peers"]["mpi"]["time_us"] > 0 for r in with_mpi), with_mpi
assert not any("peers" in r for r in in_place if r["collective"] == "reduce_scatter")
assert [line.split("|")[1].strip() for line in table[2:]] == ["allreduce", "alltoall"], table
for line, kind in zip(table[2:], ["allreduce", "alltoall"]):
    cells = [c.strip() for c in line.strip("|").split("|")[1:] if c.strip() != "-"]
    assert cells == [f"{r['peers']['mpi']['ratio']:.2f}" for r in with_mpi if r["collective"] == kind], (cells, kind)
EOF
    fail "bench_table.py matrix-in-place" "the in-place rows' MPI_IN_PLACE times or their table are wrong: $table"
  else
    ok "in-place rows beside MPI_IN_PLACE, and bench_table.py matrix-in-place holds their ratios"
  fi
  # --per-call: each row also has the median call, Tutti's and MPI's, in the text and the JSON, and
  # bench_table.py matrix-median holds MPI's median call over Tutti's.
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -s KILL 120 "$mpirun" --oversubscribe -np 2 \
    "$bench" --no-progress --collective allreduce,broadcast -b 8 -e 512 -f 8 -n 20 -w 2 --peers mpi -c 1 \
    --per-call --json "$tmp/median.json" >"$tmp/out" 2>"$tmp/err"
  status=$?
  table=$(/usr/bin/python3 "$(dirname "$0")/../../../tools/bench_table.py" matrix-median mpi "$tmp/median.json")
  if [[ $status -ne 0 ]]; then
    fail "--per-call" "status $status"
  elif [[ $(rows | grep -c " median(us) [0-9.]* mpi [0-9.]*$") -ne 6 ]]; then
    fail "--per-call" "not every row ends with Tutti's and MPI's median call: $(cat "$tmp/out")"
  elif ! /usr/bin/python3 - "$tmp/median.json" "$table" <<'EOF'; then
import json, sys
doc, table = json.load(open(sys.argv[1])), sys.argv[2].splitlines()
rows = [r for r in doc["results"] if r["in_place"] == (r["collective"] == "broadcast")]
assert len(rows) == 6 and all(r["median_us"] > 0 and r["wrong"] == 0 for r in rows), rows
for r in rows:
    mpi = r["peers"]["mpi"]
    assert mpi["median_us"] > 0 and abs(mpi["median_ratio"] - mpi["median_us"] / r["median_us"]) < 1e-9, r
for line, kind in zip(table[2:], ["allreduce", "broadcast"]):
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == kind and cells[1:] == [f"{r['peers']['mpi']['median_ratio']:.2f}" for r in rows if r["collective"] == kind], (cells, kind)
EOF
    fail "--per-call" "the JSON's median calls or bench_table.py matrix-median are wrong: $table"
  else
    ok "--per-call: the median call of Tutti and MPI per row, and bench_table.py matrix-median"
  fi
fi

# 7. Device mode: gpu::Communicator on the emulated device, with the sync peer and the D2D copy.
# Device rows: the 13 host columns, then enq max idle, sync's busbw and tutti/x, copy time and bus/d2d.
device_rows_clean() {
  rows_parse_clean "$1" || return 1
  rows | awk '{
    if (NF != 20) { print "not 20 columns: " $0; bad = 1; next }
    for (i = 14; i <= 20; i++) if ($i != "N/A" && $i != "-" && $i !~ /^[0-9.]+$/) { print "not a number: " $0; bad = 1 }
    if ($16 != "N/A" && ($16 < 0 || $16 > 1)) { print "idle outside [0, 1]: " $0; bad = 1 }
    if ($17 == "-" || $19 == "-") { print "no sync or copy measurement: " $0; bad = 1 }
  } END { exit bad }'
}
device_json_clean() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["results"]
assert doc["device"] == "emulated" and doc["ranks"] == int(sys.argv[2]), doc
kinds = {r["collective"] for r in rows}
assert {"allreduce", "reduce_scatter", "allgather", "broadcast"} <= kinds, kinds
assert {r["op"] for r in rows if r["collective"] == "allreduce"} == {"sum", "prod", "min", "max", "avg"}
assert {r["type"] for r in rows} == {"f32", "bf16"}
assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows)
assert all(r["enqueue_us"] > 0 and r["enqueue_max_us"] >= r["enqueue_us"] and 0 <= r["idle_fraction"] <= 1 for r in rows)
assert all(r["copy_us"] > 0 for r in rows)
primary = [r for r in rows if r["in_place"] == (r["collective"] == "broadcast")]
assert primary and all(r["peers"]["sync"]["wrong"] == 0 and r["peers"]["sync"]["time_us"] > 0 for r in primary)
EOF
}
for p in 1 2; do
  bench $p --device emulated --collective all -b 8 -e 4K -f 8 -n 3 -w 1 -d f32,bf16 -o all --peers sync -c 1 \
    --json "$tmp/device.json"
  if [[ $status -ne 0 ]]; then
    fail "device emulated p=$p" "exit status $status"
  elif ! why=$(device_rows_clean 90); then
    fail "device emulated p=$p" "$why"
  elif [[ $(grep -c "# Collective .* on device emulated, backend automatic" "$tmp/out") -lt 4 ]]; then
    fail "device emulated p=$p" "fewer than four collective groups"
  elif ! grep -q "Out of bounds values : 0 OK" "$tmp/out" || ! grep -q "D2D copy ceiling" "$tmp/out" ||
    ! grep -q "Device  *: emulated (functional only" "$tmp/out"; then
    fail "device emulated p=$p" "no footer"
  elif ! device_json_clean "$tmp/device.json" $p; then
    fail "device emulated p=$p" "the JSON file does not hold the device rows"
  else
    ok "device mode on the emulated device at p=$p: every collective checked, sync peer, D2D copy"
  fi
done
bench 3 --device emulated --backend host_transfer --collective allreduce,allgather -b 1 -e 64K -f 16 -n 2 -w 1 \
  -d bf16 \
  --peers sync -c 1
if [[ $status -ne 0 ]] || ! why=$(device_rows_clean 6); then
  fail "device emulated p=3 host_transfer" "status $status ${why:-}"
else
  ok "device mode at p=3, --backend host_transfer, bf16, counts 0 and up"
fi
bench 3 --device emulated --backend ipc --collective allreduce,reduce_scatter,allgather,broadcast,reduce \
  -b 1 -e 64K -f 16 \
  -n 2 -w 1 -d f64 --peers sync -c 1
if [[ $status -ne 0 ]] || ! why=$(device_rows_clean 10); then
  fail "device emulated p=3 ipc" "status $status ${why:-}"
else
  ok "device mode at p=3, --backend ipc, every collective ipc has, f64"
fi
# Ranks that name different hosts (TUTTI_HOST): ipc is refused on every rank, naming why, and
# automatic runs on host_transfer instead.
# shellcheck disable=SC2016 # expanded by the rank's shell
timeout -s KILL 120 "$run" -n 2 --timeout-ms 60000 bash -c \
  'TUTTI_HOST=host$TUTTI_RANK exec "$0" --no-progress "$@"' "$bench" --device emulated --backend ipc \
  --collective allreduce -b 64 -e 1K -f 4 -n 1 -w 0 -c 1 >"$tmp/out" 2>"$tmp/err"
status=$?
if [[ $status -eq 0 ]] || ! grep -q "ipc backend is not available: ranks 0 and 1 are on different hosts" "$tmp/out" "$tmp/err"; then
  fail "device ipc across hosts" "status $status: $(head -c 400 "$tmp/err")"
else
  ok "device mode: --backend ipc across (emulated) hosts is refused, naming the hosts"
fi
# shellcheck disable=SC2016 # expanded by the rank's shell
timeout -s KILL 120 "$run" -n 2 --timeout-ms 60000 bash -c \
  'TUTTI_HOST=host$TUTTI_RANK exec "$0" --no-progress "$@"' "$bench" --device emulated \
  --collective allreduce,broadcast \
  -b 64 -e 64K -f 8 -n 2 -w 1 -c 1 >"$tmp/out" 2>"$tmp/err"
status=$?
if [[ $status -ne 0 ]] || ! why=$(rows_parse_clean 4); then
  fail "device automatic across hosts" "status $status ${why:-}"
else
  ok "device mode: automatic across (emulated) hosts runs on host_transfer, exact"
fi
# nccl needs a CUDA device: on the emulated one, every rank stops and the reason is given.
bench 2 --device emulated --backend nccl --collective allreduce -b 64 -e 1K -f 4 -n 1 -w 0 -c 1
if [[ $status -eq 0 ]] || ! grep -q "the nccl backend is not available: it needs a CUDA device" "$tmp/out" "$tmp/err"; then
  fail "device nccl on the emulated device" "status $status: $(head -c 400 "$tmp/err")"
else
  ok "device mode: --backend nccl on the emulated device is refused, saying why"
fi
# --overlap: each row's primary form also beside the stand-in compute on a second stream (calibrated
# to about the collective's time): three more columns (compute, both, both/max), the footer's
# range, and the JSON's "overlap" on the primary form. The emulated device shares the host's cores,
# so its ratios are not checked, only that each is measured and consistent.
bench 2 --device emulated --backend host_transfer --collective allreduce,broadcast --overlap -b 64 -e 4K -f 8 \
  -n 2 -w 1 -c 1 --json "$tmp/overlap.json"
if [[ $status -ne 0 ]] || ! rows | awk '{
    if (NF != 21) { print "not 21 columns: " $0; bad = 1; next }
    for (i = 19; i <= 21; i++) if ($i !~ /^[0-9.]+$/) { print "not a number: " $0; bad = 1 }
    if ($19 <= 0 || $20 <= 0 || $21 <= 0) { print "not measured: " $0; bad = 1 }
  } END { exit bad || NR != 6 }' || ! grep -q "^\[0\] # Overlap *: both / max(collective, compute) from [0-9.]* to [0-9.]*" "$tmp/out" ||
  ! /usr/bin/python3 - "$tmp/overlap.json" <<'EOF'; then
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
primary = [r for r in rows if r["in_place"] == (r["collective"] == "broadcast")]
assert len(primary) == 6 and all("overlap" not in r for r in rows if r not in primary), rows
for r in primary:
    o = r["overlap"]
    assert o["compute_us"] > 0 and o["both_us"] > 0, r
    assert abs(o["both_over_max"] - o["both_us"] / max(o["compute_us"], r["time_us"])) < 1e-6 * o["both_over_max"], r
EOF
  fail "device --overlap" "status $status: $(head -c 600 "$tmp/out")"
else
  ok "device mode: --overlap times each row's collective beside compute on a second stream (columns, footer, JSON)"
fi
bench 2 --device emulated -b 64 -e 1K -f 4 -n 1 -w 0 -c 1 --corrupt-for-testing
if [[ $status -eq 0 ]] || ! grep -q "Out of bounds values : [1-9][0-9]* ERROR" "$tmp/out"; then
  fail "device corrupted result" "status $status; the damage was not counted"
else
  ok "device mode: a corrupted result copied back is counted as #wrong and fails the run"
fi
# --kernels: the device's reduction kernel (dst = a op b) beside a D2D copy, on one rank, each row
# checked bit for bit against the host's kernel. Rows: size count type redop, the reduce's time and
# GB/s (3 x bytes), the copy's time and GB/s (2 x bytes), their ratio and #wrong.
kernel_rows_clean() {
  local n
  n=$(rows | wc -l)
  [[ $n -eq $3 ]] || { echo "$n rows, expected $3"; return 1; }
  rows | awk -v type="$1" -v op="$2" '{
    if (NF != 10) { print "not 10 columns: " $0; bad = 1; next }
    if ($3 != type || $4 != op) { print "not " type " " op ": " $0; bad = 1 }
    if ($1 != $2 * (type == "bf16" ? 2 : 4)) { print "size is not count x element size: " $0; bad = 1 }
    for (i = 5; i <= 9; i++) if ($i !~ /^[0-9.]+$/) { print "not a number: " $0; bad = 1 }
    if ($5 + 0 <= 0 || $7 + 0 <= 0) { print "no reduce or copy time: " $0; bad = 1 }
    if ($10 != "0") { print "wrong: " $0; bad = 1 }
  } END { exit bad }'
}
for kernel in "f32 sum" "bf16 max"; do
  read -r type op <<<"$kernel"
  bench 1 --device emulated --kernels -b 8 -e 256K -f 8 -n 3 -w 1 -d "$type" -o "$op" --json "$tmp/kernels.json"
  if [[ $status -ne 0 ]]; then
    fail "kernels $kernel" "exit status $status"
  elif ! why=$(kernel_rows_clean "$type" "$op" 6); then
    fail "kernels $kernel" "$why"
  elif ! grep -Eq "# +size +count +type +redop +time +GB/s +time +GB/s +red/copy +#wrong" "$tmp/out" ||
    ! grep -Eq "# +\(B\) +\(elements\) +\(us\) +\(3 x B\) +\(us\) +\(2 x B\)" "$tmp/out"; then
    fail "kernels $kernel" "not the expected columns"
  elif ! grep -q "Out of bounds values : 0 OK" "$tmp/out" || ! grep -q "D2D copy ceiling" "$tmp/out" ||
    ! grep -q "Device  *: emulated (functional only" "$tmp/out"; then
    fail "kernels $kernel" "no footer"
  elif ! /usr/bin/python3 - "$tmp/kernels.json" "$type" "$op" <<'EOF'; then
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["results"]
assert doc["mode"] == "kernels" and doc["device"] == "emulated" and doc["ranks"] == 1, doc
assert len(rows) == 6 and all(r["type"] == sys.argv[2] and r["op"] == sys.argv[3] for r in rows), rows
assert all(r["wrong"] == 0 and r["reduce_us"] > 0 and r["copy_us"] > 0 for r in rows)
for r in rows:
    assert abs(r["reduce_GBps"] - 3 * r["bytes"] / r["reduce_us"] / 1e3) < 1e-6 * r["reduce_GBps"], r
    assert abs(r["copy_GBps"] - 2 * r["bytes"] / r["copy_us"] / 1e3) < 1e-6 * r["copy_GBps"], r
    assert abs(r["reduce_over_copy"] - r["reduce_GBps"] / r["copy_GBps"]) < 1e-6 * r["reduce_over_copy"], r
EOF
    fail "kernels $kernel" "the JSON file does not hold the kernel rows"
  else
    ok "--kernels on the emulated device, $kernel: 6 sizes, 0 wrong, reduce and copy columns, JSON"
  fi
done
bench 1 --device emulated --kernels -b 64 -e 1K -f 4 -n 1 -w 0 --corrupt-for-testing
if [[ $status -ne 1 ]] || ! grep -q "Out of bounds values : [1-9][0-9]* ERROR" "$tmp/out"; then
  fail "kernels corrupted result" "status $status; the damage was not counted"
else
  ok "--kernels: a corrupted result is counted as #wrong and fails the run"
fi
bench 2 --device emulated --kernels -b 64 -e 1K
if [[ $status -eq 0 ]] || [[ $(grep -c "tutti-bench: --kernels runs on one rank" "$tmp/err") -ne 1 ]]; then
  fail "kernels on two ranks" "status $status: $(head -c 400 "$tmp/err")"
else
  ok "--kernels on two ranks is refused in one line"
fi
for args in "--device tpu" \
  "--device emulated --backend carrier-pigeon" "--backend host_transfer" "--device emulated --peers mpi" \
  "--device emulated --collective sendrecv" "--device emulated --algorithm ring" "--device emulated --ceiling" \
  "--peers sync" \
  "--kernels" "--device emulated --kernels --collective allreduce" "--device emulated --kernels --peers sync" \
  "--overlap" "--device emulated --kernels --overlap"; do
  # shellcheck disable=SC2086
  timeout 20 "$bench" $args >"$tmp/out" 2>"$tmp/err"
  status=$?
  if [[ $status -ne 2 ]] || [[ $(wc -l <"$tmp/err") -ne 1 ]] || ! grep -q "^tutti-bench: " "$tmp/err"; then
    fail "bad device flags '$args'" "status $status"
  else
    ok "refuses '$args': $(cat "$tmp/err")"
  fi
done
# --device cuda: where nvidia-smi sees a GPU it runs and checks clean; elsewhere every rank stops,
# and rank 0 says why in one line.
if nvidia-smi -L >/dev/null 2>&1; then
  bench 2 --device cuda --collective all -b 8 -e 64K -f 8 -n 3 -w 1 --peers sync -c 1
  if [[ $status -ne 0 ]] || ! why=$(device_rows_clean 12); then
    fail "device cuda" "status $status ${why:-}"
  else
    ok "device mode on CUDA at p=2: every collective checked"
  fi
else
  for p in 1 2; do
    bench $p --device cuda -b 8 -e 64 --peers sync
    lines=$(grep -c "tutti-bench: " "$tmp/err")
    if [[ $status -ne 1 ]] || [[ $lines -ne 1 ]] ||
      ! grep -q "tutti-bench: --device cuda: .*\(no CUDA device\|built without CUDA\)" "$tmp/err"; then
      fail "device cuda without a GPU p=$p" "status $status, $lines error lines"
    else
      ok "--device cuda without a GPU fails at p=$p: $(grep "tutti-bench: " "$tmp/err")"
    fi
  done
fi
if [[ -n $mpirun ]]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -s KILL 120 "$mpirun" --oversubscribe -np 2 \
    "$bench" --no-progress --device emulated --collective allreduce,broadcast -b 8 -e 64K -f 16 -n 2 -w 1 \
    --peers sync -c 1 \
    >"$tmp/out" 2>"$tmp/err"
  status=$?
  if [[ $status -ne 0 ]] || ! why=$(device_rows_clean 6); then
    fail "device mode under mpirun" "status $status ${why:-}"
  else
    ok "device mode under mpirun"
  fi
fi

# 8. The sparse table: every sparse algorithm, the densify+allreduce row and the dense allreduce,
# checked, at 3 ranks, on both sides of the dense switch (dense_allreduce gives the sparse form
# below it); and its flags refused where they do not apply.
bench 3 --collective sparse_allreduce --density 0.01,0.6 --dim 20000 -n 2 -w 1 -d f32,i32 -o max
sparse_rows=$(sed -E 's/^\[[0-9]+\] ?//' "$tmp/out" | grep -E '^ +[0-9.]+ +[0-9]+ +[0-9]+ ' || true)
if [[ $status -ne 0 ]]; then
  fail "sparse table" "exit status $status"
elif [[ $(wc -l <<<"$sparse_rows") -ne 32 ]] || ! awk '$NF != "0" { exit 1 }' <<<"$sparse_rows"; then
  fail "sparse table" "expected 32 rows, each with #wrong 0"
elif ! grep -q "dense_allreduce  *dense" <<<"$sparse_rows" || ! grep -q "dense_allreduce  *sparse" <<<"$sparse_rows" ||
  [[ $(grep -c "densify+allreduce  *dense" <<<"$sparse_rows") -ne 4 ]] ||
  [[ $(grep -c " hierarchical  *\(sparse\|dense\)" <<<"$sparse_rows") -ne 4 ]] ||
  ! grep -q "automatic(.*) *sparse" <<<"$sparse_rows" || ! grep -q "Out of bounds values : 0 OK" "$tmp/out"; then
  fail "sparse table" "no dense_allreduce row of either form, not 4 densify+allreduce or hierarchical rows, no sparse automatic row or no footer"
else
  ok "sparse_allreduce: every algorithm and dense allreduce, checked, both forms, at p=3"
fi
refuse "--collective sparse_allreduce --density 2" "--collective sparse_allreduce --density x" \
  "--collective sparse_allreduce --dim 0" "--collective allreduce --density 0.1" \
  "--collective sparse_allreduce --peers gloo"

# 9. --values qsgd:4: one more row per f32 sum (8 + 1 rows), checked against every rank's encoding
# decoded and summed the same way (not the exact sum, which QSGD does not give).
bench 2 --collective sparse_allreduce --density 0.05 --dim 20000 -n 2 -w 1 --values qsgd:4
qsgd_rows=$(sed -E 's/^\[[0-9]+\] ?//' "$tmp/out" | grep -E '^ +[0-9.]+ +[0-9]+ +[0-9]+ ' || true)
if [[ $status -ne 0 ]]; then
  fail "sparse table with qsgd values" "exit status $status"
elif [[ $(wc -l <<<"$qsgd_rows") -ne 9 ]] || ! awk '$NF != "0" { exit 1 }' <<<"$qsgd_rows" ||
  ! grep -q "qsgd:4(allgather)  *sparse" <<<"$qsgd_rows"; then
  fail "sparse table with qsgd values" "expected 9 rows, one of them qsgd:4, each with #wrong 0"
else
  ok "sparse_allreduce --values qsgd:4: the QSGD row checked against its reference, at p=2"
fi
refuse "--collective sparse_allreduce --values qsgd:3" "--collective sparse_allreduce --values fp16" \
  "--collective allreduce --values qsgd:8"

echo "bench_test: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
