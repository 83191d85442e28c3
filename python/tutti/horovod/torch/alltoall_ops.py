"""Horovod's alltoall on torch tensors (along dim 0, with or without splits): async and
differentiable. Issued on the set's communicator, not the engine."""

import torch

from tutti.horovod import _horovod
from tutti.horovod.torch.handles import _register, _wire, synchronize
from tutti.horovod.torch.process_sets import _id_of, global_process_set


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall along dim 0: `splits[j]` rows go to the set's j-th rank (default: dim 0
    split equally). synchronize returns (output, received_splits). Issued on the set's
    communicator, not the engine: every rank must call alltoall in the same order."""
    handle = _horovod.alltoall_async(_wire(tensor), splits, name, _id_of(process_set))
    return _register(handle, lambda results: (results[0].to(tensor.dtype), results[1]))


class _Alltoall(torch.autograd.Function):
    """alltoall as a differentiable function: the gradient goes back by the alltoall with the
    received splits (as Horovod)."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received, process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Returns the rows every rank of the set sent this one, in rank order; with `splits`, also
    the received splits (as Horovod: `output` without splits, `(output, received_splits)` with
    them). Differentiable."""
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)
