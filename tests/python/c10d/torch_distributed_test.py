"""PyTorch's own DistributedTest (torch/testing/_internal/distributed/distributed_test.py) against
the backend named by BACKEND ("tutti" or "gloo"), as PyTorch's test_distributed_spawn.py runs it:
each test spawns WORLD_SIZE processes that join through a FileStore and run one test method.

    BACKEND=tutti WORLD_SIZE=3 python3 torch_distributed_test.py [--tests FILE] [--summary JSON] [-k PATTERN]

"tutti" is declared to DistTestCases as a backend with DDP and subgroups (as Gloo is), as a
plugin, and without a receive from any source, before distributed_test.py reads those sets at
import; CUDA and GPU features are not claimed, so those tests skip for both backends. Tests that
PyTorch gates to Gloo by name run against tutti too, but for those in GLOO_ONLY (below). DDP's experimental ReplicatedTensor mode stays off
(see below). --tests runs the tests named in FILE (one a line,
'#' comments), -k those whose names contain PATTERN; --summary writes the names of the passed,
failed and skipped tests (with the reason) as JSON. PYTHONPATH must reach the tutti package and
expecttest (scripts/torch_dist_tests.sh sets both up).
"""

import argparse
import functools
import json
import logging
import os
import sys
import unittest

import torch.multiprocessing
import tutti.distributed  # noqa: F401 — registers "tutti" here and in every spawned rank (they import this file)
import torch.testing._internal.common_utils as common_utils
from torch.testing._internal.common_distributed import DistTestCases

try:
    import torch.nn.parallel._replicated_tensor_ddp_utils as replicated_tensor_ddp
except ImportError:  # torch 2.x: the mode is gone
    replicated_tensor_ddp = None

# torch 1.13: every rank's _run turns on DDP's experimental ReplicatedTensor mode, whose module
# (torch.distributed._shard) does not import on Python 3.11 with torch 1.13 (a dataclass with a
# mutable default): every DDP test would fail so, for Gloo as for Tutti. Left off, DDP runs as
# users run it.
if replicated_tensor_ddp is not None:
    replicated_tensor_ddp._set_ddp_with_replicated_tensor = lambda value: None

if os.environ.get("BACKEND") == "tutti":
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("tutti")

# Tests PyTorch gates by backend name to Gloo (and NCCL, MPI) or to MPI for features of any CPU
# backend that tutti has too (DDP, get_future, batch_isend_irecv, alltoall on the CPU): run against
# tutti as well, except those named in GLOO_ONLY, which test what only ProcessGroupGloo has.
UNGATED_REASONS = (
    "Test requires backend",  # require_backend({..., "gloo", ...}): "... to be one of" (1.13), "... tutti to be one of" (2.x)
    "get_future is only supported on mpi, nccl and gloo",
    "Only Nccl & Gloo backend support DistributedDataParallel",
    "GLOO Batch Send Recv CPU",  # batch_isend_irecv on CPU tensors
    "Only MPI supports CPU all_to_all_single",  # Gloo has no alltoall in torch 1.13; tutti has
    "Only MPI supports all_to_all",
    "Only gloo backend supports timeouts",  # a barrier past the group's timeout raises; tutti's does too
    # "Only Gloo backend supports sparse all reduce" (2.x), "... support sparse ..." (1.13)
    "Only Gloo backend support",
)
GLOO_ONLY = {
    # monitored_barrier is ProcessGroupGloo's own (torch refuses it for any other backend).
    "test_monitored_barrier_failure_order": "monitored_barrier is Gloo's",
    "test_monitored_barrier_gloo": "monitored_barrier is Gloo's",
    "test_monitored_barrier_gloo_rank_0_timeout": "monitored_barrier is Gloo's",
    "test_monitored_barrier_gloo_subgroup": "monitored_barrier is Gloo's",
    "test_monitored_barrier_wait_all_ranks": "monitored_barrier is Gloo's",
    # Sparse CUDA tensors: tutti's backend takes CPU tensors (torch 2.x routes them to a CUDA backend).
    "test_sparse_all_reduce_sum_cuda": "sparse CUDA tensors: the backend takes CPU tensors",
}
# The gating decorators: sandcastle_skip(_if) in torch 1.13, skip_but_pass_in_sandcastle(_if) in 2.x.
_SKIP, _SKIP_IF = (("sandcastle_skip", "sandcastle_skip_if") if hasattr(common_utils, "sandcastle_skip")
                   else ("skip_but_pass_in_sandcastle", "skip_but_pass_in_sandcastle_if"))
_sandcastle_skip, _sandcastle_skip_if = getattr(common_utils, _SKIP), getattr(common_utils, _SKIP_IF)


def _ungated(reason, gated):
    if not reason.startswith(UNGATED_REASONS):
        return gated
    if reason.startswith("Test requires backend") and "'gloo'" not in reason:
        return gated  # NCCL's or MPI's alone
    return lambda func: gated(func) if func.__name__ in GLOO_ONLY else func


if os.environ.get("BACKEND") == "tutti":
    setattr(common_utils, _SKIP, lambda reason: _ungated(reason, _sandcastle_skip(reason)))
    setattr(common_utils, _SKIP_IF, lambda condition, reason: _ungated(
        reason, _sandcastle_skip_if(condition, reason)) if condition else _sandcastle_skip_if(condition, reason))

import torch.testing._internal.distributed.distributed_test as distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

# Their helper builds the DDP model on the CPU only `if BACKEND == "mpi" or BACKEND == "gloo"`
# (on the GPU for nccl), and otherwise fails on a name it never bound: the test applies to any
# CPU backend. Against tutti, the module reads "gloo" while the test body runs (the process group
# is tutti's, made before), so the helper builds the CPU model.
CPU_MODEL_FOR_NAMED_BACKENDS = (
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_accumulate_gradients_no_sync_grad_is_view",
)


def _with_cpu_model(func):
    @functools.wraps(func)
    def run(*args, **kwargs):
        backend, distributed_test.BACKEND = distributed_test.BACKEND, "gloo"
        try:
            return func(*args, **kwargs)
        finally:
            distributed_test.BACKEND = backend
    return run


if os.environ.get("BACKEND") == "tutti":
    for _name in CPU_MODEL_FOR_NAMED_BACKENDS:
        if hasattr(DistributedTest._DistTestBase, _name):
            setattr(DistributedTest._DistTestBase, _name, _with_cpu_model(getattr(DistributedTest._DistTestBase, _name)))


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    fork = False  # --fork: the ranks are forked from this process, which has imported torch already

    def setUp(self):
        super().setUp()
        if self.fork:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


def _names(tests_file):
    with open(tests_file) as f:
        return [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", help="file naming the tests to run, one a line")
    parser.add_argument("-k", action="append", default=[], help="run the tests whose names contain this")
    parser.add_argument("--fork", action="store_true",
                        help="fork the ranks instead of spawning them (no new interpreter importing torch per rank)")
    parser.add_argument("--summary", help="write the passed, failed and skipped tests here (JSON)")
    args = parser.parse_args()
    TestDistBackendWithSpawn.fork = args.fork
    logging.getLogger("torch.testing._internal.common_distributed").setLevel(logging.WARNING)
    loader = unittest.TestLoader()
    patterns = [f"*.{name}" for name in _names(args.tests)] if args.tests else []
    if args.tests and not patterns:
        parser.error(f"{args.tests} names no test")
    patterns += [f"*{k}*" for k in args.k]
    if patterns:
        loader.testNamePatterns = patterns
    suite = loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    name = lambda test: test.id().split(".")[-1]  # noqa: E731
    names = {name(t) for t in suite}  # before the run, which drops the tests it ran
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = sorted({name(t) for t, _ in result.failures + result.errors + result.unexpectedSuccesses})
    skipped = {name(t): reason for t, reason in result.skipped}
    passed = sorted(names - set(failed) - set(skipped))
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"backend": os.environ.get("BACKEND"), "passed": passed, "failed": failed, "skipped": skipped}, f,
                      indent=1)
    print(f"{os.environ.get('BACKEND')}: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
