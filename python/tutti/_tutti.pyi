# Type stubs of the core module tutti._tutti (python/src/core; docs/python.md).
import datetime
import enum
from typing import Any, List, Optional, Sequence, Union

# A buffer: anything with the buffer protocol (numpy.ndarray, bytearray, memoryview) or DLPack
# (torch.Tensor on the CPU, a DLPack capsule). C-contiguous; outputs writable.
Buffer = Any
Seconds = Union[float, int, datetime.timedelta, None]

__version__: str  # CMake's project version, the same as pyproject.toml's

class DataType(enum.Enum):
    i8: int
    u8: int
    i32: int
    u32: int
    i64: int
    u64: int
    f16: int
    bf16: int
    f32: int
    f64: int

class ReduceOp(enum.Enum):
    sum: int
    prod: int
    min: int
    max: int
    avg: int

class Algorithm(enum.Enum):
    automatic: int
    ring: int
    recursive_doubling: int
    rabenseifner: int
    binomial_tree: int
    bruck: int
    pairwise: int
    linear: int
    direct: int
    hierarchical: int
    mpi: int
    host_transfer: int
    ipc: int
    nccl: int

Op = Union[ReduceOp, str]
Algo = Union[Algorithm, str, None]

class Request:
    def wait(self, timeout: Seconds = None) -> bool: ...
    def test(self) -> bool: ...

class HostLayout:
    host_count: int
    host: int
    local_rank: int
    local_size: int
    host_of_rank: List[int]

class SharedBuffer:
    """Memory from Communicator.allocate (the buffer protocol: writable bytes)."""
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Communicator:
    def _capsule(self) -> Any: ...  # this communicator for the package's other modules
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def split(self, color: int, key: int = 0) -> Communicator: ...
    def host_layout(self) -> HostLayout: ...
    def allocate(self, nbytes: int) -> SharedBuffer: ...
    def allreduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Op = ReduceOp.sum, *,
                  algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def iallreduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Op = ReduceOp.sum, *,
                   algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def reduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Op = ReduceOp.sum, root: int = 0, *,
               algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def ireduce(self, send: Buffer, recv: Optional[Buffer] = None, op: Op = ReduceOp.sum, root: int = 0, *,
                algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def reduce_scatter(self, send: Buffer, recv: Optional[Buffer] = None, op: Op = ReduceOp.sum, *,
                       algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def ireduce_scatter(self, send: Buffer, recv: Optional[Buffer] = None, op: Op = ReduceOp.sum, *,
                        algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def allgather(self, send: Buffer, recv: Optional[Buffer] = None, *,
                  algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def iallgather(self, send: Buffer, recv: Optional[Buffer] = None, *,
                   algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def allgatherv(self, send: Buffer, recv_counts: Sequence[int], recv: Optional[Buffer] = None, *,
                   algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def iallgatherv(self, send: Buffer, recv_counts: Sequence[int], recv: Optional[Buffer] = None, *,
                    algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def broadcast(self, buffer: Buffer, root: int = 0, *,
                  algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def ibroadcast(self, buffer: Buffer, root: int = 0, *,
                   algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def alltoall(self, send: Buffer, recv: Optional[Buffer] = None, *,
                 algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def ialltoall(self, send: Buffer, recv: Optional[Buffer] = None, *,
                  algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def alltoallv(self, send: Buffer, send_counts: Sequence[int], recv_counts: Sequence[int],
                  recv: Optional[Buffer] = None, *, algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def ialltoallv(self, send: Buffer, send_counts: Sequence[int], recv_counts: Sequence[int],
                   recv: Optional[Buffer] = None, *, algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def gather(self, send: Buffer, recv: Optional[Buffer] = None, root: int = 0, *,
               algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def igather(self, send: Buffer, recv: Optional[Buffer] = None, root: int = 0, *,
                algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def scatter(self, send: Optional[Buffer], recv: Optional[Buffer] = None, root: int = 0, *,
                algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def iscatter(self, send: Optional[Buffer], recv: Optional[Buffer] = None, root: int = 0, *,
                 algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def barrier(self, *, algorithm: Algo = None, timeout: Seconds = None) -> None: ...
    def ibarrier(self, *, algorithm: Algo = None, timeout: Seconds = None) -> Request: ...
    def send(self, buffer: Buffer, peer: int, tag: int = 0) -> None: ...
    def isend(self, buffer: Buffer, peer: int, tag: int = 0) -> Request: ...
    def recv(self, buffer: Buffer, peer: int, tag: int = 0) -> None: ...
    def irecv(self, buffer: Buffer, peer: int, tag: int = 0) -> Request: ...

def init(
    store: Any = None,
    rank: Optional[int] = None,
    size: Optional[int] = None,
    timeout: Optional[datetime.timedelta] = None,
) -> Communicator: ...
def local_group(p: int) -> List[Communicator]: ...
