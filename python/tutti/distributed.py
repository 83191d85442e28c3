"""torch.distributed over Tutti: ``import tutti.distributed`` registers the backend ``"tutti"``.

    import torch.distributed as dist
    import tutti.distributed  # registers "tutti"

    dist.init_process_group("tutti")  # under torchrun (env://), or with init_method, rank, world_size
    # or, under tutti-run, mpirun or torchrun alike:
    tutti.distributed.init_process_group()

Every process group of backend "tutti" (the default group and each new_group) joins a Tutti
communicator of its own through the c10d store torch.distributed gives it; its operations are
Tutti's nonblocking collectives on CPU tensors (docs/torch-distributed.md). Works with torch 1.13
and torch 2.x, each with a build of tutti made against it.
"""

import atexit
import inspect
import os

import torch
import torch.distributed as dist

from tutti._torch_build import require_built_torch

require_built_torch("tutti.distributed")
from tutti import _c10d  # noqa: E402  (after the check: a module of another torch ends the process)

__all__ = ["BACKEND", "ProcessGroupTutti", "init_process_group", "launcher_rank_size", "register"]

BACKEND = "tutti"
ProcessGroupTutti = _c10d.ProcessGroupTutti


# A communicator init_process_group(communicator=...) hands to the default group being created.
_handed = None


if _c10d.IS_BACKEND:

    class _ProcessGroup(dist.ProcessGroup):
        """torch 2.x's ProcessGroup over a tutti Backend, that says whose it is.

        torch wraps a Backend registered from Python in a ProcessGroup of type CUSTOM, whose name
        is "custom": DDP's logging data (``backend_name``) and every message that names the
        backend would say "custom". A creator may return a ProcessGroup instead (torch's own
        "threaded" backend does): this one holds the Backend for the CPU, as torch's would, and
        answers getBackendName() with "tutti".
        """

        def getBackendName(self):  # noqa: N802 (torch's name)
            return BACKEND

    def _group(store, rank, world_size, backend):
        group = _ProcessGroup(store, rank, world_size)
        kind = dist.ProcessGroup.BackendType.CUSTOM
        group._set_default_backend(kind)
        group._register_backend(torch.device("cpu"), kind, backend)
        return group

else:

    def _group(store, rank, world_size, backend):
        return backend  # torch 1.x: the backend is the ProcessGroup


def _create(store, rank, world_size, timeout):
    global _handed
    if _handed is not None:
        communicator, _handed = _handed, None
        return _group(store, rank, world_size, _c10d.create_from(communicator, rank, world_size, timeout))
    return _group(store, rank, world_size, _c10d.create(store, rank, world_size, timeout))


def register():
    """Registers the backend "tutti" with torch.distributed (done at import; again is a no-op).

    On torch 2.x the backend is a c10d Backend for CPU tensors in a ProcessGroup named "tutti"; on
    torch 1.x it is the ProcessGroup itself.
    """
    if BACKEND.upper() in dist.Backend._plugins:
        return
    if _c10d.IS_BACKEND and "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    else:
        dist.Backend.register_backend(BACKEND, _create)


register()

# Each group's progress thread may drop the last reference to a tensor, which takes the GIL: once
# the interpreter is finalizing, that ends the process (std::terminate). Stop them while it is
# whole. atexit runs handlers last-registered first: a later handler that destroys process groups
# runs before this one.
atexit.register(_c10d._stop_progress)

# The rank and size variables of the launchers Tutti knows, in the order tutti::init() reads them.
_LAUNCHERS = (
    ("TUTTI_RANK", "TUTTI_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)


def launcher_rank_size():
    """(rank, size) from tutti-run's, mpirun's or srun's variables, or None without a launcher."""
    for rank, size in _LAUNCHERS:
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None


def init_process_group(backend=BACKEND, init_method=None, rank=-1, world_size=-1, communicator=None, **kwargs):
    """dist.init_process_group with the rendezvous taken from the launcher when not given.

    Rank and size come from RANK and WORLD_SIZE (torchrun), else from tutti-run's, mpirun's or
    srun's variables. The rendezvous is env:// when MASTER_ADDR is set (torchrun; export it under
    mpirun), else under tutti-run a FileStore in the job's private store directory (TUTTI_STORE).
    `communicator`: a tutti.Communicator the default group runs over (the same group: rank and size
    are its own) instead of joining one of its own; torch still needs the rendezvous for itself.
    Other arguments go to dist.init_process_group unchanged.
    """
    global _handed
    if communicator is not None:
        if backend != BACKEND:
            raise ValueError(f"tutti.distributed.init_process_group: communicator= needs backend {BACKEND!r}")
        rank, world_size = communicator.rank, communicator.size
    if init_method is None and "store" not in kwargs:
        found = None if "RANK" in os.environ else launcher_rank_size()
        if found is not None and rank < 0 and world_size < 0:
            rank, world_size = found
        tutti_store = os.environ.get("TUTTI_STORE", "")
        if "MASTER_ADDR" in os.environ or found is None:
            init_method = "env://"
        elif tutti_store.startswith("file://"):
            init_method = tutti_store.rstrip("/") + "/torch-c10d-store"
        else:
            raise ValueError(
                "tutti.distributed.init_process_group: no rendezvous; set MASTER_ADDR and MASTER_PORT "
                "(e.g. mpirun -x MASTER_ADDR=host -x MASTER_PORT=29500) or pass init_method"
            )
    _handed = communicator
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, **kwargs)
    finally:
        _handed = None
