#!/usr/bin/env bash
# mpirun.sh MPIEXEC PYTHON SCRIPT N: runs SCRIPT on N ranks under mpirun, with the env://
# rendezvous torch.distributed needs there (MASTER_ADDR, and a MASTER_PORT free on loopback).
set -euo pipefail
mpiexec=$1 python=$2 script=$3 ranks=$4
port=$("$python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
exec timeout 240 "$mpiexec" --allow-run-as-root --oversubscribe -n "$ranks" -x MASTER_ADDR=127.0.0.1 -x "MASTER_PORT=$port" \
  -x PYTHONPATH -x PYTHONDONTWRITEBYTECODE -x TUTTI_TIMEOUT_MS "$python" "$script"
