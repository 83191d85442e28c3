"""What every Horovod operation here shares: Horovod's reduction ops, its error for a failed
collective, the handles (synchronize, poll, grouped handles and their names), and the helpers
that scale tensors and widen the types Tutti has no DataType for."""

import torch

from tutti.horovod import _horovod
from tutti._errors import Error, InvalidArgument


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
