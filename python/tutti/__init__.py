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
from ._tutti import __version__, Algorithm, Communicator, DataType, HostLayout, ReduceOp, Request, SharedBuffer, init, local_group

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
