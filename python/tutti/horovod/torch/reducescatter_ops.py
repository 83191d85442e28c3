"""Horovod's reducescatter on torch tensors (each rank gets its block of dim 0 of the reduction),
run as the engine's allreduce: async, differentiable, and grouped_reducescatter."""

import torch

from tutti.horovod import _horovod
from tutti._errors import InvalidArgument
from tutti.horovod.torch.allgather_ops import allgather_async, grouped_allgather_async
from tutti.horovod.torch.handles import (Average, HorovodInternalError, Sum, _register, _scale, _start_group, _wire,
                                         synchronize)
from tutti.horovod.torch.process_sets import _id_of, _rank_in, _size_of, global_process_set


def _scatter_rows(rows, size, index):
    """Horovod's reducescatter split of dim 0: rows // size each, one more for the first
    rows % size ranks. (offset, count) of block `index`."""
    base, extra = divmod(rows, size)
    return index * base + min(index, extra), base + (1 if index < extra else 0)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts the reduction over the set's ranks of `tensor` (op Average or Sum), of which this
    rank gets its block of dim 0 (dim 0 split as evenly as it goes, the first ranks one row
    more). synchronize returns the block. Runs as the engine's (negotiated, fused) allreduce and
    keeps this rank's block."""
    if op not in (Average, Sum):
        raise InvalidArgument("tutti.horovod reducescatter: op must be Average or Sum (Adasum, Min, Max and "
                              "Product are not reducescatter ops in Horovod)")
    if tensor.dim() == 0:
        raise HorovodInternalError("tutti.horovod reducescatter: the tensor is a scalar; reducescatter needs at "
                                   "least one dimension")
    size, index = _size_of(process_set), _rank_in(process_set)
    offset, count = _scatter_rows(tensor.shape[0], size, index)
    source = _wire(_scale(tensor, prescale_factor))
    output = torch.empty_like(source, memory_format=torch.contiguous_format)
    handle = _horovod.allreduce_async(source, output, name, op, _id_of(process_set), "reducescatter")

    def finish(results):
        block = results[0].narrow(0, offset, count).to(tensor.dtype).clone()
        return _scale(block, postscale_factor)

    return _register(handle, finish)


class _Reducescatter(torch.autograd.Function):
    """reducescatter as a differentiable function: the gradient is the allgather of the blocks'
    gradients (times the set's size for op Sum, as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allgather_async(grad_output.contiguous(), process_set=ctx.process_set))
        if ctx.op == Sum:
            grad = grad * _size_of(ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Returns this rank's block of dim 0 of the reduction over the set's ranks (op Average by
    default, or Sum). Differentiable."""
    if compression is None:
        return _Reducescatter.apply(tensor, name, op, process_set, prescale_factor, postscale_factor)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(
        _Reducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor), ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts the reducescatter of every tensor of the list; synchronize returns the list of blocks."""
    return _start_group(lambda t, n: reducescatter_async(t, n, op, process_set, prescale_factor, postscale_factor),
                        tensors, name)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                             postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = synchronize(grouped_allgather_async([g.contiguous() for g in grad_outputs],
                                                    process_set=ctx.process_set))
        if ctx.op == Sum:
            grads = [g * _size_of(ctx.process_set) for g in grads]
        return (None, None, None, None, None) + tuple(grads)


def grouped_reducescatter(tensors, name=None, compression=None, op=Average, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0):
    """The reducescatter of every tensor of the list; returns the list of blocks. Differentiable."""
    if compression is None:
        return list(_GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *tensors))
    pairs = [compression.compress(t) for t in tensors]
    out = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                      *[c for c, _ in pairs])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, pairs)]
