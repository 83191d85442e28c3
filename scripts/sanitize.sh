#!/usr/bin/env bash
# The test suites that matter for each sanitizer, built with it (CMakePresets.json):
#   asan   ASan + UBSan (no recovery), build-asan/: the unit, multi-process, fault and hostile
#          suites (the multi-process ones through tutti-run, every rank instrumented)
#   tsan   TSan, build-tsan/: the suites of the threaded layers (engine, executor, transports,
#          bootstrap), ranks as threads
# Usage: bash scripts/sanitize.sh asan|tsan [--build|--test] [extra ctest arguments]
#   --build only builds (scripts/test.sh builds a later stage's tree on idle cores), --test only
#   runs the tests of a tree already built; without either it builds, then tests.
# A report fails its test (halt_on_error / no recovery); the only accepted reports are the
# suppressions in tests/sanitizers/, each with its reason. Prints one summary line at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/jobs.sh
preset=${1:?usage: sanitize.sh asan|tsan [--build|--test] [ctest arguments]}
shift
steps=both
case ${1:-} in
  --build) steps=build; shift ;;
  --test) steps=test; shift ;;
esac
root=$PWD
supp=$root/tests/sanitizers
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

case $preset in
  asan)
    export ASAN_OPTIONS="abort_on_error=0:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:suppressions=$supp/asan.supp"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
    # Every suite the build has except those that do not exercise Tutti's code under ASan:
    #   mpi_*           not built: the instrumented presets leave MPI out (Open MPI is not instrumented)
    #   tutti_bench     a benchmark (timings, its Gloo/MPI peers), minutes under ASan; tutti-bench's
    #                   option parsing still runs in the unit suites
    #   plot_*          Python scripts
    #   mp_tcp_two_hosts needs network namespaces (root), skipped on CI anyway
    #   cluster_2x2     likewise (scripts/cluster.sh); the routed transport it runs is in
    #                   transport_conformance_test, which runs
    #   mp_shm_direct_p5/p8 the code of mp_shm_direct_p2/p3 (which run) with more ranks than
    #                   cores: 2 and 4 minutes of spinning ranks under ASan on 2 cores
    #   soak            a minute of repeated jobs under ASan; its code is the mp suites' (which
    #                   run), and the normal suite runs it
    #   package.install installs this build (instrumented) and links a plain consumer against it,
    #                   which has no ASan runtime; it tests packaging, and the normal suite runs it
    #   gpu_test.strict.{one_queue,host_transfer}, gpu_collectives_test.strict.{host_transfer,ipc_1MiB}
    #                   the strict device's code again with one setting changed; gpu_test.strict
    #                   (which runs) covers it under ASan, the normal suite runs them all
    labels='unit|mp|fault|hostile|emulated'
    exclude='^(mpi_|tutti_bench$|plot_|mp_tcp_two_hosts$|cluster_2x2$|mp_shm_direct_p[58]$|soak$|package\.install$'
    exclude+='|gpu_test\.strict\.(one_queue|host_transfer)$|gpu_collectives_test\.strict\.(host_transfer|ipc_1MiB)$)'
    ;;
  tsan)
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$supp/tsan.supp"
    # The threaded layers, ranks as threads: the engine (its background thread), the executor and
    # its progress engine (collectives_test's sweep over inproc, api_test, hierarchical_test and
    # shm_direct_test run collectives through it), the transports, the store and the emulated
    # device (a worker thread per stream) and the stream-aware collectives over it (gpu_test: a
    # progress thread per communicator), and the sparse collectives (sparse::Communicator's
    # progress thread). Each binary runs in one process (not one per test case):
    # only these are built.
    # gpu_test.strict: gpu_test again on the strict emulated device (one context shared by the
    # rank threads, its queue workers, and the order in which those ranks submit; docs/gpu.md).
    binaries=(shm_direct_test sparse_test gpu_collectives_test collectives_test shm_test transport_conformance_test
              gpu_test.strict gpu_test hierarchical_test tcp_test api_test engine_gpu_test device_test bootstrap_test
              engine_test exec_test)
    # Left out under TSan: the sweeps over data types and ops, and the hierarchical sweep above
    # 4 ranks. They repeat the same threads' interleavings with other values at many times the
    # cost (under TSan on 2 cores: 5 minutes of the 10); the normal and ASan runs run them whole.
    # Likewise the sparse test of the value types' widths in large vectors' pieces: the pieces'
    # threads run under TSan in SparseAllreduce.RecycledResultsGiveFreshResults (4 pieces of 64
    # KiB) and DenseAllreduceGivesTheFormTheUnionCalls (5 and 10 pieces, the union's bitmaps
    # gathered beside them).
    # The hierarchical sweep keeps p = 2, 3, 4, and Hierarchical.InterleavesWithOtherOperations
    # runs 5 ranks.
    # And the large counts (1 000 003 elements, every algorithm) at 8 ranks, over inproc and shm:
    # the same chunked and pipelined paths as at 3 ranks, which run, with 8 threads copying and
    # reducing megabytes under TSan (measured 2026-11-28, each alone: 15 s of the inproc large
    # cases' 44 s, 18 s of the shm ones' 44 s).
    sweeps=(ShmDirect.EveryTypeAndOp Shm.AllreduceEveryAlgorithmAndSize SparseAllreduce.EveryValueTypeIndexTypeAndOp
            GpuCollectives.ReduceEveryRootTypeAndOp P/HierarchicalSweep.EveryLayoutOpTypeCountAndPlace/{3,4,5,6}
            SparseAllreduce.LargeDenseVectorsReducedInOverlappingPieces
            'Large/Collectives.MatchesReference/*_p8_*' Shm.CollectiveLargeCountsEightRanks)
    tsan_filter=--gtest_filter=-$(IFS=:; echo "${sweeps[*]}")
    ;;
  *)
    echo "usage: sanitize.sh asan|tsan" >&2
    exit 2
    ;;
esac

start=$(date +%s)
if [[ $steps != test ]]; then
  cmake --preset "$preset" "${launcher[@]}" >/dev/null
  if [[ $preset == asan ]]; then
    build_quietly "sanitize $preset" "build-$preset" || exit 1
  else
    build_quietly "sanitize $preset" "build-$preset" --target "${binaries[@]/gpu_test.strict/gpu_test}" || exit 1
  fi
fi
built=$(date +%s)
if [[ $steps == build ]]; then
  echo "sanitize $preset: built ($((built - start)) s)"
  exit 0
fi
log=$root/build-$preset/sanitize.log
status=0
if [[ $preset == asan ]]; then
  (cd "build-$preset" && ctest --output-on-failure -j "$(nproc)" --timeout 900 -L "$labels" -E "$exclude" "$@") |
    tee "$log" || status=$?
  summary=$(grep -E 'tests passed|tests failed' "$log" | tail -n 1)
else
  : >"$log"
  # As many binaries at once as there are cores, the longest first (the list's order, measured
  # 2026-11-29 two at a time on 2 cores: 84, 82, 79, 64, 62, 59, 55, 47, 44, 36, 18, 10 s and less;
  # 351 s in all).
  results=$(mktemp -d)
  run_one() {
    local binary=$1 one_start result=ok
    one_start=$(date +%s)
    if [[ $binary == gpu_test.strict ]]; then
      TUTTI_EMULATED_STRICT=1 timeout 900 "build-$preset/tests/gpu_test" --gtest_brief=1 "${extra[@]}" \
        >"$log.$binary" 2>&1 || result=FAILED
    else
      timeout 900 "build-$preset/tests/$binary" --gtest_brief=1 "$tsan_filter" "${extra[@]}" >"$log.$binary" 2>&1 ||
        result=FAILED
    fi
    echo "tsan $binary: $result ($(($(date +%s) - one_start)) s)" >"$results/$binary"
  }
  extra=("$@")
  run_parallel run_one "${binaries[@]}"
  passed=0 failed=0
  for binary in "${binaries[@]}"; do
    line=$(cat "$results/$binary")
    if [[ $line == *": ok "* ]]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)) status=1
      tail -n 150 "$log.$binary"
    fi
    echo "$line" | tee -a "$log"
  done
  rm -rf "$results"
  summary="$passed passed, $failed failed (test binaries)"
fi
end=$(date +%s)
built_in=" (build $((built - start)) s, tests $((end - built)) s)"
[[ $steps == test ]] && built_in=" (tests $((end - built)) s)"
echo "sanitize $preset: ${summary:-no tests ran}$built_in"
exit "$status"
