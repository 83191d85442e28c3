"""Horovod's allgather on torch tensors (along dim 0, the first dimensions may differ between
ranks): async, differentiable, and grouped_allgather."""

import torch

from tutti.horovod import _horovod
from tutti.horovod.torch.allreduce_ops import allreduce_async, grouped_allreduce_async
from tutti.horovod.torch.handles import _WIRE, Average, _register, _start_group, _wire, synchronize
from tutti.horovod.torch.process_sets import _id_of, _rank_in, global_process_set


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts gathering every rank's `tensor` along dim 0 (the first dimensions may differ between
    ranks; the other dimensions and the type must not). synchronize returns the concatenation in
    the order of the set's ranks."""
    if tensor.dtype in _WIRE:
        handle = _horovod.allgather_async(_wire(tensor), name, _id_of(process_set))
        return _register(handle, lambda results: results[0].to(tensor.dtype))
    return _horovod.allgather_async(tensor, name, _id_of(process_set))


class _Allgather(torch.autograd.Function):
    """allgather as a differentiable function: each rank's gradient is its block of the
    gradient averaged over the set's ranks (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        gathered = synchronize(allgather_async(tensor, name=name, process_set=process_set))  # rejects a scalar
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return gathered

    @staticmethod
    def backward(ctx, grad_output):
        reduced = synchronize(allreduce_async(grad_output.contiguous(), op=Average, process_set=ctx.process_set))
        rows = synchronize(allgather_async(torch.tensor([ctx.rows], dtype=torch.int64), process_set=ctx.process_set))
        offset = int(rows[:_rank_in(ctx.process_set)].sum())
        return reduced.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns every rank's `tensor` concatenated along dim 0, in rank order. Differentiable."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts the allgather of every tensor of the list; synchronize returns the list of results."""
    return _start_group(lambda t, n: allgather_async(t, n, process_set), tensors, name)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name=name, process_set=process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grad_outputs], op=Average,
                                                      process_set=ctx.process_set))
        rows = synchronize(allgather_async(torch.tensor([ctx.rows], dtype=torch.int64),
                                           process_set=ctx.process_set))
        offsets = rows[:_rank_in(ctx.process_set)].sum(dim=0).tolist()
        grads = [r.narrow(0, int(o), n) for r, o, n in zip(reduced, offsets, ctx.rows)]
        return (None, None) + tuple(grads)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """The allgather of every tensor of the list; returns the list of results. Differentiable."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))
