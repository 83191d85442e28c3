#!/usr/bin/env bash
# scripts/gpu_check.sh's dry run (TUTTI_GPU_CHECK_DRY_RUN=1, as on a machine without a GPU): every
# stage, in the device check's order, is SKIP with its reason in the results file, and the exit
# status is 0. Usage: gpu_check_dry_run_test.sh SCRIPT
set -u
script=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
text=$(OUT=$out TUTTI_GPU_CHECK_DRY_RUN=1 timeout 60 bash "$script" "$out/no-bundle" 2>&1)
status=$?
echo "$text"
fail=0
[[ $status -eq 0 ]] || { echo "FAIL: exit status $status"; fail=1; }
want="environment cuda_waits device_suite process_gate nccl_p1 thread_diagnostics fault_cuda engine_suite kernels bench"
got=$(tail -n +2 "$out/gpu_check_results.tsv" | cut -f 1 | tr '\n' ' ')
[[ $got == "$want " ]] || { echo "FAIL: stages '$got', expected '$want '"; fail=1; }
[[ $(head -n 1 "$out/gpu_check_results.tsv") == $'stage\tstatus\tseconds\treason' ]] || { echo "FAIL: no header"; fail=1; }
if tail -n +2 "$out/gpu_check_results.tsv" | cut -f 2 | grep -vqx SKIP; then
  echo "FAIL: a stage other than SKIP"
  fail=1
fi
if tail -n +2 "$out/gpu_check_results.tsv" | cut -f 4 | grep -vq "dry run"; then
  echo "FAIL: a skip without its reason"
  fail=1
fi
[[ $(grep -c "^gpu_check: .* SKIP " <<<"$text") -eq 10 ]] || { echo "FAIL: not one SKIP line per stage"; fail=1; }
((fail == 0)) && echo "ok: gpu_check dry run, 10 stages skipped, exit status 0"
exit $fail
