"""Horovod's PyTorch API over Tutti (docs/horovod.md).

    import tutti.horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Run the script with `tutti-run -n N python3 script.py`. Named operations go through Tutti's
training engine (negotiation by name, fusion, timeline); Horovod's variables
HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME and HOROVOD_TIMELINE set its options, and
start_timeline()/stop_timeline() start and stop the timeline while the job runs.
"""

import atexit
import os
import sys

import torch  # noqa: F401  (loads libtorch and its Python bindings before the extension)

from tutti._torch_build import require_built_torch

require_built_torch("tutti.horovod.torch")
from tutti._launcher import torchrun_store  # noqa: E402
from tutti.horovod import _horovod
from tutti._errors import InvalidArgument, Unsupported
import tutti
from tutti import __version__  # noqa: F401
from tutti.horovod.torch.collectives import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
    allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
    broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async, grouped_allreduce,
    grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
    grouped_reducescatter_async, join, poll, reducescatter, reducescatter_async, sparse_allreduce_async,
    synchronize)
from tutti.horovod.torch.process_sets import (  # noqa: F401
    ProcessSet, _init_global_process_set, add_process_set, global_process_set, remove_process_set)
from tutti.horovod.torch.compression import Compression  # noqa: F401
from tutti.horovod.torch.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from tutti.horovod.torch.optimizer import DistributedOptimizer  # noqa: F401
from tutti.horovod.torch import elastic  # noqa: F401,E402

# Horovod's variable -> (Tutti's, how to read it).
_VARIABLES = {
    "HOROVOD_FUSION_THRESHOLD": ("TUTTI_FUSION_THRESHOLD", int),
    "HOROVOD_CYCLE_TIME": ("TUTTI_CYCLE_TIME_MS", float),
    "HOROVOD_TIMELINE": ("TUTTI_TIMELINE", str),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("TUTTI_STALL_WARNING_S", float),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("TUTTI_STALL_SHUTDOWN_S", float),
    "HOROVOD_CACHE_CAPACITY": (None, int),
}

# HOROVOD_LOG_LEVEL -> TUTTI_DEBUG (Tutti has warn, info and trace).
_LOG_LEVELS = {"trace": "trace", "debug": "info", "info": "info", "warning": "warn", "error": "warn",
               "fatal": "warn"}


def _log_level():
    """Sets TUTTI_DEBUG from HOROVOD_LOG_LEVEL (Horovod's wins), before the engine starts."""
    text = os.environ.get("HOROVOD_LOG_LEVEL")
    if not text:
        return
    level = _LOG_LEVELS.get(text.strip().lower())
    if level is None:
        raise InvalidArgument("HOROVOD_LOG_LEVEL: expected one of %s, got %r" % (", ".join(_LOG_LEVELS), text))
    other = os.environ.get("TUTTI_DEBUG")
    if other is not None and other != level:
        print("tutti.horovod: HOROVOD_LOG_LEVEL=%s replaces TUTTI_DEBUG=%s" % (text, other), file=sys.stderr)
    os.environ["TUTTI_DEBUG"] = level


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
        if parse is not str and value < 0:
            raise InvalidArgument("%s: expected a non-negative number, got %r" % (name, text))
        other = os.environ.get(tutti_name) if tutti_name else None
        if other is not None and other != text:
            print("tutti.horovod: %s=%s replaces %s=%s" % (name, text, tutti_name, other), file=sys.stderr)
        values[name] = value
    if values.get("HOROVOD_TIMELINE") == "DYNAMIC":  # Horovod's "started later by start_timeline()": no file yet
        del values["HOROVOD_TIMELINE"]
    stall_warning_s = values.get("HOROVOD_STALL_CHECK_TIME_SECONDS")
    if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "") not in ("", "0"):
        stall_warning_s = 0.0
    # HOROVOD_CACHE_CAPACITY is checked and not used: the engine's response cache (names seen
    # before travel as one bit) holds up to 65536 names whatever it says.
    return dict(fusion_threshold=values.get("HOROVOD_FUSION_THRESHOLD"),
                cycle_time_ms=values.get("HOROVOD_CYCLE_TIME"),
                timeline=values.get("HOROVOD_TIMELINE"),
                stall_warning_s=stall_warning_s,
                stall_shutdown_s=values.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"))


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
    environment; alone, a job of one rank. A second call does nothing. `process_sets` (a list of
    ProcessSet) are added once the job is joined, as add_process_set would. `comm`: a
    tutti.Communicator to run over (the same group; its ranks are Horovod's), where Horovod takes
    an MPI communicator (not supported: an mpi4py communicator or a list of ranks)."""
    global _exit_hooks_installed
    if comm is not None and not isinstance(comm, tutti.Communicator):
        raise Unsupported("tutti.horovod.torch.init: comm must be a tutti.Communicator (an MPI communicator or a "
                          f"list of ranks is not supported), got {type(comm).__name__}")
    if not _horovod.is_initialized():
        found = None if comm is not None else torchrun_store()
        store = {} if found is None else dict(zip(("store", "rank", "size"), found))
        if comm is not None:
            store = {"communicator": comm}
        settings = _settings()
        _log_level()
        _horovod.init(**settings, **store)
        _init_global_process_set()
        for process_set in process_sets or []:
            add_process_set(process_set)
    if not _exit_hooks_installed:
        _exit_hooks_installed = True
        sys.excepthook = _note_uncaught
        atexit.register(_shutdown_at_exit)


def shutdown():
    """Stops the engine (collective); operations still in flight fail with tutti.Aborted."""
    _horovod.shutdown()


def start_timeline(file_path, mark_cycles=False):
    """Horovod's dynamic timeline: starts writing the engine's timeline (the Chrome trace that
    HOROVOD_TIMELINE writes) to `file_path`, after init(). Rank 0 writes it and the other ranks
    nothing, unless the path contains "{rank}" (then every rank writes its own, with its rank in
    the name). A timeline already being written (HOROVOD_TIMELINE's, or an earlier call's) is
    closed first, complete. `mark_cycles`: each negotiation round is an instant event
    CYCLE_START. Not collective. HOROVOD_TIMELINE=DYNAMIC is not required (Horovod requires it).
    Raises a ValueError (tutti.InvalidArgument) before init() or for a file it cannot write."""
    _horovod.start_timeline(os.fspath(file_path), bool(mark_cycles))


def stop_timeline():
    """Stops the timeline and closes its file (complete JSON when this returns); does nothing
    when none is being written. A ValueError (tutti.InvalidArgument) before init()."""
    _horovod.stop_timeline()


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
