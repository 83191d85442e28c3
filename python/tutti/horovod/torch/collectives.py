"""Horovod's collectives on torch tensors, over Tutti's training engine (docs/horovod.md).

Every named operation (allreduce, allgather, broadcast) is enqueued on the engine under its name;
the engine runs it once every rank has enqueued that name, whatever order the ranks enqueued
their names in, and fuses small allreduces. alltoall goes straight to the communicator, so every
rank must issue its alltoalls in the same order. A `*_async` call returns a handle at once;
`synchronize(handle)` waits for it and returns the result, `poll(handle)` says whether it is done.
"""

import torch

from tutti.horovod import _horovod
from tutti._errors import InvalidArgument, Unsupported

# Horovod's reduction ops (the values Horovod gives them).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

# Post-processing of each handle at synchronize (scaling, decompression), by handle.
_finishers = {}


def _check_process_set(process_set):
    if process_set is not None:
        raise Unsupported("tutti.horovod.torch: process sets are not supported (only the global set)")


def _op_of(op, average):
    if average is not None:
        if op is not None:
            raise InvalidArgument("tutti.horovod.torch: pass either op or the deprecated average, not both")
        return Average if average else Sum
    return Average if op is None else op


def _register(handle, finisher=None):
    if finisher is not None:
        _finishers[handle] = finisher
    return handle


def synchronize(handle):
    """Waits for the operation of `handle` and returns its result: the output tensor (alltoall:
    the output and the received splits). Raises the operation's tutti.Error (e.g. tutti.Mismatch
    when the ranks gave the same name to tensors of different shapes)."""
    finisher = _finishers.pop(handle, None)
    results = _horovod.synchronize(handle)
    if finisher is not None:
        return finisher(results)
    return results[0]


def poll(handle):
    """True once the operation of `handle` has finished: synchronize(handle) then returns its
    result, or raises its error, at once. Never blocks."""
    return _horovod.poll(handle)


def _scaled(results, tensor, postscale_factor):
    out = results[0]
    if postscale_factor != 1.0:
        out.mul_(postscale_factor)
    if tensor is not None and tensor is not out:
        tensor.copy_(out)
        return tensor
    return out


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    """In place: `tensor` becomes the reduction over ranks (op Average by default). Returns a
    handle; the tensor must not be touched until synchronize(handle)."""
    _check_process_set(process_set)
    op = _op_of(op, average)
    if prescale_factor != 1.0:
        tensor.mul_(prescale_factor)
    handle = _horovod.allreduce_async(tensor, tensor, name, op)
    return _register(handle, lambda results: _scaled(results, tensor, postscale_factor))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    """Out of place: synchronize(handle) returns a new tensor holding the reduction over ranks."""
    _check_process_set(process_set)
    op = _op_of(op, average)
    source = tensor * prescale_factor if prescale_factor != 1.0 else tensor
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    handle = _horovod.allreduce_async(source, output, name, op)
    return _register(handle, lambda results: _scaled(results, None, postscale_factor))


class _Allreduce(torch.autograd.Function):
    """allreduce as a differentiable function: the gradient is reduced with the same op."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale_factor, postscale_factor
        return synchronize(allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allreduce_async(grad_output.contiguous(), op=ctx.op, prescale_factor=ctx.prescale,
                                           postscale_factor=ctx.postscale))
        return grad, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """Returns the reduction over ranks of `tensor` (op Average by default; Sum, Min, Max,
    Product; Adasum raises tutti.Unsupported). `compression` (Compression.none or .fp16) applies
    to what travels. Differentiable. The input is not modified."""
    _check_process_set(process_set)
    op = _op_of(op, average)
    if compression is None:
        return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    """In place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set))


def allgather_async(tensor, name=None, process_set=None):
    """Starts gathering every rank's `tensor` along dim 0 (the first dimensions may differ between
    ranks; the other dimensions and the type must not). synchronize returns the concatenation in
    rank order."""
    _check_process_set(process_set)
    return _horovod.allgather_async(tensor, name)


class _Allgather(torch.autograd.Function):
    """allgather as a differentiable function: each rank's gradient is its block of the
    gradient averaged over ranks (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, name):
        gathered = synchronize(allgather_async(tensor, name=name))  # rejects a scalar
        ctx.rows = tensor.shape[0]
        return gathered

    @staticmethod
    def backward(ctx, grad_output):
        reduced = synchronize(allreduce_async(grad_output.contiguous(), op=Average))
        rows = synchronize(allgather_async(torch.tensor([ctx.rows], dtype=torch.int64)))
        offset = int(rows[:_horovod.rank()].sum())
        return reduced.narrow(0, offset, ctx.rows), None


def allgather(tensor, name=None, process_set=None):
    """Returns every rank's `tensor` concatenated along dim 0, in rank order. Differentiable."""
    _check_process_set(process_set)
    return _Allgather.apply(tensor, name)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """In place: `tensor` becomes root_rank's."""
    _check_process_set(process_set)
    return _horovod.broadcast_async(tensor, root_rank, name)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Out of place: synchronize(handle) returns a new tensor holding root_rank's `tensor`."""
    _check_process_set(process_set)
    return _horovod.broadcast_async(tensor.clone(memory_format=torch.contiguous_format), root_rank, name)


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """In place broadcast; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    """broadcast as a differentiable function: root gets the gradient averaged over ranks, the
    other ranks zero (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = synchronize(allreduce_async(grad_output.contiguous(), op=Average))
        if _horovod.rank() != ctx.root:
            reduced.zero_()
        return reduced, None, None


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Returns root_rank's `tensor` on every rank. Differentiable. The input is not modified."""
    _check_process_set(process_set)
    return _Broadcast.apply(tensor, root_rank, name)


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts an alltoall along dim 0: `splits[j]` rows go to rank j (default: dim 0 split
    equally). synchronize returns (output, received_splits). Issued on the communicator, not the
    engine: every rank must call alltoall in the same order."""
    _check_process_set(process_set)
    return _register(_horovod.alltoall_async(tensor, splits, name), lambda results: tuple(results))


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Returns the rows every rank sent this one, in rank order; with `splits`, also the received
    splits (as Horovod: `output` without splits, `(output, received_splits)` with them)."""
    output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


def join(device=-1):
    """Blocks until every rank has called join(); returns the rank that called it last.

    Horovod's join also lets the ranks that have not joined go on reducing, with the joined ranks
    contributing zeros; Tutti does not: a rank's allreduce issued after another rank joined waits
    for that rank (and is reported as stalled). Call join() where every rank is done."""
    return _horovod.join()


def barrier(process_set=None):
    """Returns on every rank once every rank has entered it."""
    _check_process_set(process_set)
    _horovod.barrier()
