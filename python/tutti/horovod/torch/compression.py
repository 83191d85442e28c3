"""Horovod's gradient compression: what a tensor is turned into before it travels."""

import torch


class Compressor:
    """compress(tensor) -> (tensor to reduce, context); decompress(reduced, context) -> tensor."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (the engine reduces them in float16); others as
    they are. The result comes back in the tensor's own type."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors, as Horovod names them: Compression.none, Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
