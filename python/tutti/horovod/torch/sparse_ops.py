"""Horovod's reduction of a sparse COO tensor, by allgathering its indices and values."""

import torch

from tutti._errors import InvalidArgument
from tutti.horovod.torch.allgather_ops import allgather_async
from tutti.horovod.torch.handles import Average, Sum, synchronize
from tutti.horovod.torch.process_sets import _size_of, global_process_set


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
