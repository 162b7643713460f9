"""What a Horovod call takes and gives back: numpy arrays, anything ``np.asarray`` takes, and
torch tensors, as horovod.torch does, without importing torch.

A torch tensor is recognised by the module of its type (``torch``) and handled through
``sys.modules["torch"]`` (the caller's program imported it); ``import collectives.framework.horovod``
never imports torch (it costs more than a second). A contiguous CPU tensor is read through
``Tensor.numpy()``, a view of its memory (no copy); any other is made contiguous on the CPU
first. Results come back as ``torch.from_numpy`` of the new array (no copy), of the input's
dtype, shape and device. ``bfloat16``, which numpy has not got, travels as its bits (int16)
in the collectives that move data, and is refused by the reductions.

A 0-d input gives a 0-d result (``np.ascontiguousarray`` would make it 1-d).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor (or Parameter), without importing torch."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def torch_module():
    """The ``torch`` module the program imported (only called for torch inputs)."""
    return sys.modules["torch"]


@dataclass(frozen=True)
class Like:
    """How to give a result back in the type of an input.

    Attributes:
        torch_dtype: the input tensor's dtype (None: the input was not a tensor).
        device: the input tensor's device.
        bits: the dtype numpy held the tensor's bits in when numpy lacks its dtype
            (``bfloat16`` as ``int16``), else None.
    """

    torch_dtype: object = None
    device: object = None
    bits: object = None

    @property
    def is_torch(self) -> bool:
        return self.torch_dtype is not None


NUMPY = Like()


def to_array(x) -> tuple[np.ndarray, Like]:
    """``x`` as a C-contiguous numpy array (a view of a contiguous CPU tensor's memory: do not
    write into it), and how to give results back in its type.

    Raises:
        TypeError: a torch tensor of a dtype numpy has not got (other than bfloat16), or
            something ``np.asarray`` cannot take.
    """
    if type(x) is np.ndarray and x.flags.c_contiguous:  # (the common case, first)
        return x, NUMPY
    if is_torch(x):
        torch = torch_module()
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        bits = None
        if t.dtype == torch.bfloat16:
            t, bits = t.view(torch.int16), np.dtype(np.int16)
        try:
            arr = t.numpy()
        except TypeError as exc:
            raise TypeError(f"a torch tensor of dtype {x.dtype} cannot be sent: {exc}") \
                from None
        return arr, Like(x.dtype, x.device, bits)
    arr = np.asarray(x)
    if arr.ndim and not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr, NUMPY


def from_array(arr: np.ndarray, like: Like):
    """``arr`` (a new array of the call's result) in the type ``like`` describes."""
    if not like.is_torch:
        return arr
    torch = torch_module()
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr)
    out = torch.from_numpy(arr)
    if like.bits is not None:
        out = out.view(like.torch_dtype)
    if out.device != like.device:
        out = out.to(like.device)
    return out


def write_into(target, result) -> None:
    """Write ``result`` (a numpy array of ``target``'s shape and dtype) into ``target``, a
    writeable numpy array or a torch tensor (in place, outside autograd, as horovod.torch's
    in-place ops).

    Raises:
        TypeError: ``target`` is neither, or a read-only array.
    """
    if is_torch(target):
        torch = torch_module()
        with torch.no_grad():
            src = torch.from_numpy(result if result.flags.writeable else result.copy())
            if target.dtype == torch.bfloat16:
                src = src.view(torch.bfloat16)
            target.copy_(src.reshape(target.shape))
        return
    if not isinstance(target, np.ndarray) or not target.flags.writeable:
        raise TypeError(f"in-place ops need a writeable numpy array or a torch tensor, got "
                        f"{type(target).__name__}")
    np.copyto(target, result.reshape(target.shape))


def reduction_check(like: Like, what: str) -> None:
    """Refuse a reduction of a dtype numpy only holds as bits.

    Raises:
        TypeError: bfloat16 (names it).
    """
    if like.bits is not None:
        raise TypeError(f"hvd.{what}: torch.bfloat16 tensors cannot be reduced here (numpy has "
                        "no bfloat16); cast them to torch.float32")
