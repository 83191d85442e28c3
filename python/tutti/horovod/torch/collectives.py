"""Horovod's collectives on torch tensors, over Tutti's training engine (docs/horovod.md).

Every named operation (allreduce, allgather, broadcast) is enqueued on the engine under its name;
the engine runs it once every rank has enqueued that name, whatever order the ranks enqueued
their names in, and fuses small allreduces. alltoall goes straight to the communicator, so every
rank must issue its alltoalls in the same order. A `*_async` call returns a handle at once;
`synchronize(handle)` waits for it and returns the result, `poll(handle)` says whether it is done.
Each family is a module of its own (handles, allreduce_ops, allgather_ops, reducescatter_ops,
broadcast_ops, alltoall_ops, sparse_ops); this one gathers their public names, and holds join and
barrier.
"""

from tutti.horovod import _horovod
from tutti.horovod.torch.process_sets import _id_of, global_process_set
from tutti.horovod.torch.handles import (  # noqa: F401
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, poll, synchronize)
from tutti.horovod.torch.allreduce_ops import (  # noqa: F401
    allreduce, allreduce_, allreduce_async, allreduce_async_, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_)
from tutti.horovod.torch.allgather_ops import (  # noqa: F401
    allgather, allgather_async, grouped_allgather, grouped_allgather_async)
from tutti.horovod.torch.reducescatter_ops import (  # noqa: F401
    grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async)
from tutti.horovod.torch.broadcast_ops import broadcast, broadcast_, broadcast_async, broadcast_async_  # noqa: F401
from tutti.horovod.torch.alltoall_ops import alltoall, alltoall_async  # noqa: F401
from tutti.horovod.torch.sparse_ops import sparse_allreduce_async  # noqa: F401


def join(device=-1):
    """Horovod's join: this rank has run out of data. Until every rank has joined, it takes part
    in the other ranks' allreduces with zeros (an Average still divides by size()), and their
    allgathers and broadcasts fail (a RuntimeError naming the joined ranks). Blocks until every
    rank has joined; returns the rank that joined last, the same on every rank. `device` is
    accepted and ignored (CPU tensors only). Operations of this rank must all be complete first."""
    return _horovod.join()


def barrier(process_set=global_process_set):
    """Returns on every rank of the set once every one of them has entered it."""
    _horovod.barrier(_id_of(process_set))
