"""Horovod's allreduce family on torch tensors: allreduce in place and out of place, async and
differentiable, and grouped_allreduce (the engine fuses the group's members)."""

import torch

from tutti.horovod import _horovod
from tutti.horovod.torch.handles import _op_of, _register, _scale, _start_group, _wire, synchronize
from tutti.horovod.torch.process_sets import _id_of, global_process_set


def _finished(out, tensor, postscale_factor):
    """The reduced `out` scaled, in `tensor`'s type, and copied into `tensor` unless it is None."""
    out = _scale(out, postscale_factor)
    if tensor is not None:
        if tensor is not out:
            tensor.copy_(out)
        return tensor
    return out


def _start_allreduce(tensor, name, op, prescale_factor, postscale_factor, process_set, in_place, kind="allreduce"):
    """The allreduce of tensor × prescale_factor; at synchronize, the result × postscale_factor (in
    `tensor` itself where in_place)."""
    source = _wire(_scale(tensor, prescale_factor))
    direct = in_place and source is tensor
    output = source if direct else torch.empty_like(source, memory_format=torch.contiguous_format)
    handle = _horovod.allreduce_async(source, output, name, op, _id_of(process_set), kind)

    def finish(results):
        out = results[0] if results[0].dtype == tensor.dtype else results[0].to(tensor.dtype)
        return _finished(out, tensor if in_place else None, postscale_factor)

    return _register(handle, finish)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """In place: `tensor` becomes the reduction over the set's ranks (op Average by default).
    Returns a handle; the tensor must not be touched until synchronize(handle)."""
    op = _op_of(op, average)
    return _start_allreduce(tensor, name, op, prescale_factor, postscale_factor, process_set, True)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Out of place: synchronize(handle) returns a new tensor holding the reduction over ranks."""
    op = _op_of(op, average)
    return _start_allreduce(tensor, name, op, prescale_factor, postscale_factor, process_set, False)


class _Allreduce(torch.autograd.Function):
    """allreduce as a differentiable function: the gradient is reduced with the same op."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return synchronize(allreduce_async(tensor, name=name, op=op, prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = synchronize(allreduce_async(grad_output.contiguous(), op=ctx.op, prescale_factor=ctx.prescale,
                                           postscale_factor=ctx.postscale, process_set=ctx.process_set))
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Returns the reduction over the set's ranks of `tensor` (op Average by default; Sum, Min,
    Max, Product; Adasum raises tutti.Unsupported). `compression` (Compression.none or .fp16)
    applies to what travels. Differentiable. The input is not modified."""
    op = _op_of(op, average)
    if compression is None:
        return _Allreduce.apply(tensor, name, op, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In place allreduce; returns `tensor`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts the allreduce of every tensor of the list (the engine fuses them); synchronize
    returns the list of results. Named ones are NAME.0, NAME.1, ..."""
    op = _op_of(op, average)
    return _start_group(lambda t, n: _start_allreduce(t, n, op, prescale_factor, postscale_factor, process_set,
                                                      False), tensors, name)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In place grouped allreduce."""
    op = _op_of(op, average)
    return _start_group(lambda t, n: _start_allreduce(t, n, op, prescale_factor, postscale_factor, process_set,
                                                      True), tensors, name)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.prescale, ctx.postscale, ctx.process_set = op, prescale_factor, postscale_factor, process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), name=name, op=op,
                                                         prescale_factor=prescale_factor,
                                                         postscale_factor=postscale_factor,
                                                         process_set=process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = synchronize(grouped_allreduce_async([g.contiguous() for g in grad_outputs], op=ctx.op,
                                                    prescale_factor=ctx.prescale, postscale_factor=ctx.postscale,
                                                    process_set=ctx.process_set))
        return (None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """The allreduce of every tensor of the list; returns the list of results. Differentiable."""
    op = _op_of(op, average)
    if compression is None:
        return list(_GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set, *tensors))
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                      *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """In place grouped allreduce; returns the tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))
