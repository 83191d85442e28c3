"""Horovod's PyTorch API over Tutti (docs/horovod.md).

    import tutti.horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Run the script with `tutti-run -n N python3 script.py`. Named operations go through Tutti's
training engine (negotiation by name, fusion, timeline); Horovod's variables
HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME and HOROVOD_TIMELINE set its options.
"""

import atexit
import os
import sys

import torch  # noqa: F401  (loads libtorch and its Python bindings before the extension)

from tutti._launcher import torchrun_store
from tutti.horovod import _horovod
from tutti._errors import InvalidArgument, Unsupported
from tutti.horovod.torch.collectives import (  # noqa: F401
    Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce, allreduce_, allreduce_async,
    allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_, broadcast_async, broadcast_async_,
    join, poll, synchronize)
from tutti.horovod.torch.compression import Compression  # noqa: F401
from tutti.horovod.torch.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from tutti.horovod.torch.optimizer import DistributedOptimizer  # noqa: F401

# Horovod's variable -> (Tutti's, how to read it).
_VARIABLES = {
    "HOROVOD_FUSION_THRESHOLD": ("TUTTI_FUSION_THRESHOLD", int),
    "HOROVOD_CYCLE_TIME": ("TUTTI_CYCLE_TIME_MS", float),
    "HOROVOD_TIMELINE": ("TUTTI_TIMELINE", str),
}


def _settings():
    """The engine options Horovod's variables set. Where both a HOROVOD_ variable and its TUTTI_
    equivalent are set, Horovod's wins (a Horovod script's user tunes it by Horovod's names), and
    a warning says so when they differ."""
    values = {}
    for name, (tutti_name, parse) in _VARIABLES.items():
        text = os.environ.get(name)
        if text is None or text == "":
            continue
        try:
            value = parse(text)
        except ValueError:
            raise InvalidArgument("%s: expected %s, got %r" % (name, "an integer" if parse is int else "a number",
                                                              text)) from None
        if parse is int and value < 0:
            raise InvalidArgument("%s: expected a non-negative number of bytes, got %r" % (name, text))
        other = os.environ.get(tutti_name)
        if other is not None and other != text:
            print("tutti.horovod: %s=%s replaces %s=%s" % (name, text, tutti_name, other), file=sys.stderr)
        values[name] = value
    return dict(fusion_threshold=values.get("HOROVOD_FUSION_THRESHOLD"),
                cycle_time_ms=values.get("HOROVOD_CYCLE_TIME"),
                timeline=values.get("HOROVOD_TIMELINE"))


_exit_hooks_installed = False
_uncaught = False


def _note_uncaught(kind, value, traceback, previous=sys.excepthook):
    global _uncaught
    _uncaught = True
    previous(kind, value, traceback)


def _shutdown_at_exit():
    if not _uncaught:
        shutdown()
        return
    # Stopping the engine is collective: a rank leaving on an exception would wait for peers that
    # may be waiting for it. It leaves at once instead; tutti-run reports its status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def init(comm=None, process_sets=None):
    """Joins the job (collective): under tutti-run, mpirun, srun or torchrun, from their
    environment; alone, a job of one rank. A second call does nothing. `comm` and `process_sets`
    (an MPI communicator, process sets) are not supported."""
    global _exit_hooks_installed
    if comm is not None or process_sets is not None:
        raise Unsupported("tutti.horovod.torch.init: comm and process_sets are not supported")
    if not _horovod.is_initialized():
        found = torchrun_store()
        store = {} if found is None else dict(zip(("store", "rank", "size"), found))
        _horovod.init(**_settings(), **store)
    if not _exit_hooks_installed:
        _exit_hooks_installed = True
        sys.excepthook = _note_uncaught
        atexit.register(_shutdown_at_exit)


def shutdown():
    """Stops the engine (collective); operations still in flight fail with tutti.Aborted."""
    _horovod.shutdown()


def is_initialized():
    return _horovod.is_initialized()


def size():
    """The number of ranks."""
    return _horovod.size()


def rank():
    """This rank, from 0 to size() - 1."""
    return _horovod.rank()


def local_rank():
    """This rank's index among the ranks on its host (TUTTI_HOST, else the host name)."""
    return _horovod.local_rank()


def local_size():
    """The number of ranks on this rank's host."""
    return _horovod.local_size()


def cross_rank():
    """This host's index among the hosts (numbered by their first rank)."""
    return _horovod.cross_rank()


def cross_size():
    """The number of hosts."""
    return _horovod.cross_size()


def is_homogeneous():
    """Whether every host runs the same number of ranks."""
    return size() == local_size() * cross_size()


def _not_built():
    """False: Tutti's own transports do the work, with CPU tensors only."""
    return False


# What this build has, in Horovod's words: no MPI, Gloo, NCCL, CUDA, ROCm, DDL or oneCCL.
mpi_built = mpi_enabled = mpi_threads_supported = gloo_built = gloo_enabled = _not_built
nccl_built = cuda_built = rocm_built = ddl_built = ccl_built = _not_built
