"""Horovod's helpers for starting a job: copying root's parameters, optimizer state and any
picklable object to every rank."""

import collections.abc
import pickle

import torch

from tutti.horovod import _horovod
from tutti._errors import InvalidArgument
from tutti.horovod.torch.collectives import broadcast_, broadcast_async_, allgather, synchronize


def broadcast_parameters(params, root_rank):
    """Copies root_rank's tensors into every rank's, in place. `params` is a dict (a module's
    state_dict(); its items are taken in name order) or a list of (name, tensor) pairs, e.g.
    named_parameters(). The names must be the same on every rank; a name with another shape on
    another rank is a tutti.Mismatch on every rank."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, collections.abc.Iterable):
        items = list(params)
    else:
        raise InvalidArgument("broadcast_parameters: params must be a dict or a list of (name, tensor) pairs, not " +
                              type(params).__name__)
    handles = []
    for name, tensor in items:
        if tensor is None:
            continue
        # In place on the tensor's data: parameters that require grad are leaves autograd must not see.
        handles.append(broadcast_async_(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor,
                                        root_rank, name="broadcast_parameters." + str(name)))
    for handle in handles:
        synchronize(handle)


class _TensorSpec:
    """Where a tensor sat in root's optimizer state: its shape and type travel pickled, its data
    by a broadcast of its own."""

    def __init__(self, tensor, index):
        self.shape, self.dtype, self.index = tuple(tensor.shape), tensor.dtype, index


def _map(value, is_leaf, fn):
    """`value` (nested dicts, lists and tuples) with every leaf replaced by fn(leaf)."""
    if is_leaf(value):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map(v, is_leaf, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, is_leaf, fn) for v in value)
    return value


def _split_tensors(value, tensors):
    """`value` with every tensor replaced by a _TensorSpec (the tensors appended to `tensors`)."""
    def spec(tensor):
        tensors.append(tensor.detach().contiguous())
        return _TensorSpec(tensor, len(tensors) - 1)

    return _map(value, torch.is_tensor, spec)


def _is_spec(value):
    return isinstance(value, _TensorSpec)


def broadcast_optimizer_state(optimizer, root_rank):
    """Copies root_rank's optimizer settings (every param group's lr, momentum, ...) and state
    (momentum buffers, Adam's moments and steps, ...) into every rank's `optimizer`, for any
    torch.optim optimizer. The structure travels pickled (broadcast_object), every state tensor
    by a broadcast of its own. The optimizers must have the same param groups on every rank.
    As Horovod, a parameter that requires grad and has none gets a zero gradient (sparse for
    SparseAdam) while the optimizer has no state yet."""
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
    tensors = []
    skeleton = _split_tensors(optimizer.state_dict(), tensors) if _horovod.rank() == root_rank else None
    skeleton = broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state.structure")
    if _horovod.rank() != root_rank:
        specs = []
        _map(skeleton, _is_spec, specs.append)
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in sorted(specs, key=lambda s: s.index)]
    handles = [broadcast_async_(t, root_rank, name="broadcast_optimizer_state.%d" % i) for i, t in enumerate(tensors)]
    for handle in handles:
        synchronize(handle)
    if _horovod.rank() != root_rank:
        optimizer.load_state_dict(_map(skeleton, _is_spec, lambda spec: tensors[spec.index]))


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns root_rank's `obj` (pickled, broadcast, unpickled) on every rank. Unnamed calls are
    named by their order, so every rank must make them in the same order."""
    if _horovod.rank() == root_rank:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name=None if name is None else name + ".length", process_set=process_set)
    if _horovod.rank() != root_rank:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=None if name is None else name + ".data", process_set=process_set)
    return obj if _horovod.rank() == root_rank else pickle.loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's `obj`, in rank order (pickled and gathered). Unnamed
    calls are named by the object's type, as in Horovod (so a rank that skipped one, having
    joined, does not shift the names of the next ones)."""
    if name is None:
        name = type(obj).__name__
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                        name=name + ".lengths", process_set=process_set)
    data = allgather(payload, name=name + ".data", process_set=process_set).numpy()
    objects, offset = [], 0
    for n in lengths.tolist():
        objects.append(pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return objects
