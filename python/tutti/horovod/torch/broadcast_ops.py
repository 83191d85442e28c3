"""Horovod's broadcast on torch tensors: in place and out of place, async and differentiable."""

import torch

from tutti.horovod import _horovod
from tutti.horovod.torch.allreduce_ops import allreduce_async
from tutti.horovod.torch.handles import _WIRE, Average, _register, _wire, synchronize
from tutti.horovod.torch.process_sets import _id_of, global_process_set


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In place: `tensor` becomes root_rank's (a job rank, member of the set)."""
    if tensor.dtype in _WIRE:
        wide = _wire(tensor)
        handle = _horovod.broadcast_async(wide, root_rank, name, _id_of(process_set))
        return _register(handle, lambda results: tensor.copy_(results[0]))
    return _horovod.broadcast_async(tensor, root_rank, name, _id_of(process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Out of place: synchronize(handle) returns a new tensor holding root_rank's `tensor`."""
    return broadcast_async_(tensor.clone(memory_format=torch.contiguous_format), root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In place broadcast; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    """broadcast as a differentiable function: root gets the gradient averaged over the set's
    ranks, the other ranks zero (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        reduced = synchronize(allreduce_async(grad_output.contiguous(), op=Average, process_set=ctx.process_set))
        if _horovod.rank() != ctx.root:
            reduced.zero_()
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank of the set. Differentiable. The input is not
    modified."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)
