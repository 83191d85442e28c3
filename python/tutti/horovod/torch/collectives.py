"""Horovod's collectives on torch tensors, over Tutti's training engine (docs/horovod.md).

Every named operation (allreduce, allgather, broadcast) is enqueued on the engine under its name;
the engine runs it once every rank has enqueued that name, whatever order the ranks enqueued
their names in, and fuses small allreduces. alltoall goes straight to the communicator, so every
rank must issue its alltoalls in the same order. A `*_async` call returns a handle at once;
`synchronize(handle)` waits for it and returns the result, `poll(handle)` says whether it is done.
"""

import torch

from tutti.horovod import _horovod
from tutti._errors import Error, InvalidArgument
from tutti.horovod.torch.process_sets import _id_of, _rank_in, _size_of, global_process_set


class HorovodInternalError(Error):
    """Horovod's name for a collective that failed; raised here where Horovod's suite expects it
    (a scalar to reducescatter). Tutti's own errors (tutti.Mismatch, tutti.Timeout...) are
    RuntimeErrors too."""

# Horovod's reduction ops (the values Horovod gives them).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

# Post-processing of each handle at synchronize (scaling, decompression), by handle.
_finishers = {}


# Types Tutti has no DataType for travel widened, and come back in their own type (int16 as int32:
# sums, products, minima and maxima modulo 2^16 are those of int16).
_WIRE = {torch.int16: torch.int32}


def _wire(tensor):
    return tensor.to(_WIRE[tensor.dtype]) if tensor.dtype in _WIRE else tensor


def _scale(tensor, factor):
    """tensor × factor in tensor's type, computed as Horovod does on the CPU: integers in float64
    (truncated back), float16 and bfloat16 in float32."""
    if factor == 1.0:
        return tensor
    if not tensor.is_floating_point():
        return (tensor.double() * factor).to(tensor.dtype)
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return (tensor.float() * factor).to(tensor.dtype)
    return tensor * factor


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
    if isinstance(handle, _GroupHandle):
        return _synchronize_group(handle)
    finisher = _finishers.pop(handle, None)
    results = _horovod.synchronize(handle)
    if finisher is not None:
        return finisher(results)
    return results[0]


def poll(handle):
    """True once the operation of `handle` has finished: synchronize(handle) then returns its
    result, or raises its error, at once. Never blocks."""
    if isinstance(handle, _GroupHandle):
        return all(poll(h) for h in handle.handles)
    return _horovod.poll(handle)


def _synchronize_group(group):
    """Every member's result, in order; the first error after waiting for all."""
    results, error = [], None
    for h in group.handles:
        try:
            results.append(synchronize(h))
        except Exception as e:  # every handle is waited for, so none is left in flight
            error = error or e
    if error is not None:
        raise error
    return results


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


class _GroupHandle:
    """The handle of a grouped operation: one handle per tensor, synchronized together."""

    def __init__(self, handles):
        self.handles = handles


def _group_names(name, count):
    return [None] * count if name is None else ["%s.%d" % (name, i) for i in range(count)]


def _start_group(start, tensors, name):
    names = _group_names(name, len(tensors))
    handles = []
    try:
        for tensor, n in zip(tensors, names):
            handles.append(start(tensor, n))
    except Exception:
        for h in handles:  # none is left in flight
            try:
                synchronize(h)
            except Exception:
                pass
        raise
    return _GroupHandle(handles)


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


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's reduction of a sparse COO tensor: its indices and values are allgathered (NAME.indices,
    NAME.values); returns a function that waits and returns the sparse sum (op Sum) or average
    (op Average) over the set's ranks, uncoalesced."""
    if op not in (Average, Sum):
        raise InvalidArgument("tutti.horovod sparse_allreduce_async: op must be Average or Sum")
    indices_handle = allgather_async(tensor._indices().transpose(0, 1).contiguous(), name="%s.indices" % name,
                                     process_set=process_set)
    values_handle = allgather_async(tensor._values().contiguous(), name="%s.values" % name,
                                    process_set=process_set)

    def handle():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / _size_of(process_set)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, tensor.size())

    return handle


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
