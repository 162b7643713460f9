"""``hvd.Compression``: horovod.torch's compressors, for numpy arrays and torch tensors.

``Compression.none`` leaves a tensor as it is; ``Compression.fp16`` sends a floating-point
tensor as float16 and gives the result back in its own dtype (other dtypes as they are).
A compressor is a class with ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``, as horovod.torch's (a user's own works too).
"""

from __future__ import annotations

import numpy as np

from collectives.framework.horovod._tensors import is_torch, torch_module


class Compressor:
    """The interface: compress before the collective, decompress after."""

    @staticmethod
    def compress(tensor):
        """``(tensor to send, context for decompress)``."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """The result in the caller's form."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 (half the bytes; float16 rounding)."""

    @staticmethod
    def compress(tensor):
        if is_torch(tensor):
            if tensor.dtype.is_floating_point:
                return tensor.to(torch_module().float16), tensor.dtype
            return tensor, tensor.dtype
        arr = np.asarray(tensor)
        if np.issubdtype(arr.dtype, np.floating):
            return arr.astype(np.float16), arr.dtype
        return arr, arr.dtype

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is None:
            return tensor
        if is_torch(tensor):
            return tensor.to(ctx) if ctx.is_floating_point else tensor
        return tensor.astype(ctx) if np.issubdtype(ctx, np.floating) else tensor


class Compression:
    """The compressors an allreduce takes (``compression=hvd.Compression.fp16``)."""

    none = NoneCompressor
    fp16 = FP16Compressor
