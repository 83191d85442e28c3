#!/usr/bin/env bash
# Jobs started by launchers Tutti does not ship, with their variables emulated: srun without
# TUTTI_STORE (the ranks meet in the user's rendezvous directory, rank 0 draws the TCP token there
# and removes the step's directory once the world is up), and torchrun's variables (RANK,
# WORLD_SIZE, TORCHELASTIC_RUN_ID). A job of several ranks that cannot be joined fails on every
# rank with what to set; it never runs as a job of one rank. The C++ ranks are the test program's
# job-sum mode (each checks the world size and the sum); the Python cases call tutti.init().
#
#   launcher_env_test.sh FAULT_PROGRAM PYTHON PYTHONPATH   (PYTHON '-': the Python cases are skipped, saying so)
set -uo pipefail
program=$1
python=$2
export PYTHONPATH=$3
source "$(dirname "$0")/../lib.sh"
dir=$scratch
# Nothing of the environment this test runs in may leak into its ranks.
clean_env=(env -u TUTTI_RANK -u TUTTI_SIZE -u TUTTI_STORE -u TUTTI_TOKEN -u TUTTI_JOB_ID -u TUTTI_TRANSPORT
  -u TUTTI_HOST -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT
  -u TORCHELASTIC_RUN_ID -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE
  -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_JOB_ID TUTTI_TIMEOUT_MS=20000 TUTTI_DEBUG=info)

# job NAME SIZE PER-RANK-COMMAND: starts SIZE ranks of `bash -c PER-RANK-COMMAND` with $r set to
# the rank (the last one first), waits, and leaves each rank's output in $dir/NAME.r.
job() {
  local name=$1 size=$2 command=$3 r first=${#pids[@]} status=0
  for ((r = size - 1; r >= 0; r--)); do
    r=$r "${clean_env[@]}" timeout -s KILL 60 bash -c "$command" >"$dir/$name.$r" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]:first}"; do wait "$pid" || status=1; done
  return $status
}
outputs() { cat "$dir/$1".*; }
all_ranks_say() {  # all_ranks_say NAME SIZE PATTERN: every rank's output matches
  local r
  for ((r = 0; r < $2; r++)); do grep -q -- "$3" "$dir/$1.$r" || return 1; done
}

slurm="SLURM_PROCID=\$r SLURM_NTASKS=\$JOB_SIZE SLURM_LOCALID=\$r SLURM_JOB_ID=77 SLURM_STEP_ID=0"

# 1. srun, one node, no TUTTI_STORE: shared memory; the step's directory is gone afterwards.
mkdir -m 700 "$dir/rv"
job srun-one 3 "JOB_SIZE=3 JOB_TAG=5 $slurm TUTTI_RENDEZVOUS_DIR=$dir/rv exec $program job-sum"
status=$?
all_ranks_say srun-one 3 "ok job 5" && all_ranks_say srun-one 1 "transport shm" && [[ $status -eq 0 ]]
check "srun without TUTTI_STORE, one node: the ranks meet in TUTTI_RENDEZVOUS_DIR" $? "$(outputs srun-one)"
[[ ! -e $dir/rv/slurm-77.0 ]]
check "srun: rank 0 removed the step's directory once the world was up" $? "$(ls -la "$dir/rv")"

# 2. srun over two (emulated) nodes and no TUTTI_TOKEN: TCP between them, with the token rank 0
#    drew in the private directory; the default directory is under HOME.
mkdir -m 700 "$dir/home"
job srun-two 4 "JOB_SIZE=4 JOB_TAG=7 HOME=$dir/home TUTTI_HOST=node\$((r / 2)) $slurm exec $program job-sum"
status=$?
all_ranks_say srun-two 4 "ok job 7" && all_ranks_say srun-two 1 "transport shm+tcp" && [[ $status -eq 0 ]]
check "srun over two nodes without TUTTI_TOKEN: TCP with a token drawn in the private directory" $? \
  "$(outputs srun-two)"
[[ -d $dir/home/.tutti/rendezvous && ! -e $dir/home/.tutti/rendezvous/slurm-77.0 ]] &&
  [[ $(stat -c %a "$dir/home/.tutti") == 700 && $(stat -c %a "$dir/home/.tutti/rendezvous") == 700 ]]
check "srun: the default directory is HOME/.tutti/rendezvous, mode 0700, and the step's is removed" $? \
  "$(ls -laR "$dir/home")"

# 3. A step directory others may read (it would carry the token) is refused on every rank.
mkdir -m 755 "$dir/rv/slurm-78.0"
job srun-open 2 "JOB_SIZE=2 $slurm SLURM_JOB_ID=78 TUTTI_RENDEZVOUS_DIR=$dir/rv exec $program job-sum"
status=$?
all_ranks_say srun-open 2 "init failed: invalid_argument: .*slurm-78.0' belongs to another user or others may read" &&
  [[ $status -ne 0 ]]
check "srun: a step directory others may read is refused on every rank" $? "$(outputs srun-open)"

# 4. torchrun's variables: C++ init() cannot use torchrun's store, and says what to set on every
#    rank, at once (no rank waits, none runs as a job of one).
start=$SECONDS
job torchrun-nostore 2 "RANK=\$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 TORCHELASTIC_RUN_ID=t1 exec $program job-sum"
status=$?
all_ranks_say torchrun-nostore 2 "init failed: invalid_argument: .*started by torchrun.*TUTTI_STORE" &&
  [[ $status -ne 0 && $((SECONDS - start)) -lt 15 ]]
check "torchrun without TUTTI_STORE: C++ init() refuses on every rank, naming TUTTI_STORE" $? "$(outputs torchrun-nostore)"

# 5. torchrun's variables with a store: the job id is torchrun's run id (no TUTTI_JOB_ID needed).
mkdir -m 700 "$dir/store"
job torchrun-store 3 "JOB_SIZE=3 JOB_TAG=11 RANK=\$r WORLD_SIZE=3 LOCAL_RANK=\$r LOCAL_WORLD_SIZE=3 \
  TORCHELASTIC_RUN_ID=run-5 TORCHELASTIC_RESTART_COUNT=0 TUTTI_STORE=file://$dir/store exec $program job-sum"
status=$?
all_ranks_say torchrun-store 3 "ok job 11" && [[ $status -eq 0 ]] && ls "$dir/store" | grep -q "run-5.0"
check "torchrun with TUTTI_STORE: the ranks join under torchrun's run id" $? "$(outputs torchrun-store; ls "$dir/store")"

# 6. One rank under torchrun needs no store.
job torchrun-one 1 "JOB_SIZE=1 JOB_TAG=3 RANK=0 WORLD_SIZE=1 exec $program job-sum"
status=$?
all_ranks_say torchrun-one 1 "ok job 3" && [[ $status -eq 0 ]]
check "torchrun with one rank: a job of one, no store needed" $? "$(outputs torchrun-one)"

if [[ $python == - ]]; then
  finish "the Python cases SKIPPED (the core module tutti._tutti is not built)"
  exit
fi

# 7. Python: RANK and WORLD_SIZE without MASTER_ADDR/MASTER_PORT (a launcher of one's own) raise
#    InvalidArgument naming them; WORLD_SIZE alone names RANK.
# py_refused NAME SIZE VARIABLES PATTERN: tutti.init() on every rank raises InvalidArgument matching PATTERN.
py_refused() {
  job "$1" "$2" "$3 exec $python -c 'import tutti
try:
    tutti.init()
except tutti.InvalidArgument as e:
    print(\"refused:\", e)'"
  all_ranks_say "$1" "$2" "refused: $4"
}
py_refused py-nomaster 2 "RANK=\$r WORLD_SIZE=2" ".*MASTER_ADDR and MASTER_PORT"
check "tutti.init() with RANK and WORLD_SIZE but no MASTER_ADDR: InvalidArgument naming them" $? "$(outputs py-nomaster)"
py_refused py-nosize 1 "WORLD_SIZE=2" "WORLD_SIZE is set but RANK is not"
check "tutti.init() with WORLD_SIZE only: InvalidArgument naming RANK" $? "$(outputs py-nosize)"

finish
