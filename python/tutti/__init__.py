"""Tutti: collective communication for distributed training (docs/python.md).

    import numpy as np, tutti
    world = tutti.init()                     # the job tutti-run (or mpirun) started
    x = np.full(4, world.rank, dtype=np.float32)
    world.allreduce(x, op=tutti.ReduceOp.sum)  # in place
    r = world.iallreduce(x)                  # nonblocking: returns a Request
    r.wait()

Buffers are anything with the buffer protocol (NumPy arrays, bytearray, memoryview) or DLPack
(torch CPU tensors); they must be C-contiguous, and outputs writable. Failures raise tutti.Error
subclasses, one per C++ ErrorCode, with the C++ message.
"""

from ._errors import (
    Aborted,
    Error,
    InvalidArgument,
    Mismatch,
    PeerFailure,
    SystemError_,
    Timeout,
    Unsupported,
)
from ._tutti import __version__, Algorithm, Communicator, DataType, HostLayout, ReduceOp, Request, SharedBuffer, local_group
from . import _launcher, _tutti

__all__ = [
    "__version__",
    "Aborted",
    "Algorithm",
    "Communicator",
    "DataType",
    "Error",
    "HostLayout",
    "InvalidArgument",
    "Mismatch",
    "PeerFailure",
    "ReduceOp",
    "Request",
    "SharedBuffer",
    "SystemError_",
    "Timeout",
    "Unsupported",
    "init",
    "local_group",
]


def init(store=None, rank=None, size=None, timeout=None):
    """Joins the job (collective) and returns its world Communicator.

    Under tutti-run, mpirun or srun, from their variables; under torchrun, through torchrun's own
    store (MASTER_ADDR, MASTER_PORT) unless TUTTI_STORE is set; without a launcher, a job of one
    rank. With `store` (an object with torch.distributed.Store's methods: set, get, add, wait),
    joins through it as `rank` of `size`; `timeout` (a datetime.timedelta) bounds the rendezvous.
    A job of several ranks that cannot be joined raises tutti.InvalidArgument saying what to set.
    """
    if store is None and rank is None and size is None:
        found = _launcher.torchrun_store(timeout)
        if found is not None:
            store, rank, size = found
    return _tutti.init(store, rank, size, timeout)
