"""Float16 programs at float32 speed: each float16 operation computed in float32 on the CPU
and its results rounded to float16, as the IPU's AMP computes float16 with float32 partials
(issue 30, item 3).

CPU PyTorch's float16 kernels are many times slower than its float32 ones (a 2-layer MLP: 58
times), so a PopTorch program written for the IPU in float16 (``model.half()``, float16
inputs) would take minutes a step here. :class:`HalfAsFloat` is a ``TorchDispatchMode``
under autograd: every ATen operation that has a float16 tensor operand runs on float32
copies of its float16 operands (one copy per float16 storage while it is unchanged, made
the first time an operation reads it: an activation read by its backward, or a parameter
read by the forward, the backward and the optimizer, is converted once a step) and its
floating results are rounded back to float16
(operations that write into an operand, ``add_`` and the like, write the rounded result into
the float16 tensor; the new results of an operation that also writes operands, batch norm's
output beside the running statistics it updates, are rounded as any operation's). The tensors the program sees stay float16: parameters, activations and
gradients are float16, so the memory plan counts them at 2 bytes, and the compute model
prices their operations in float16 (:class:`poptorch.modelling._op_ledger.OpLedger` sees the float16
operations: this mode sits below it). What is rounded, and where, is the IPU's:

* ``Precision.setPartialsType(torch.float)`` (the default, PopART's ``partialsTypeMatMuls``
  "float"): a matmul's or convolution's float32 accumulation, rounded once to float16;
* ``Precision.setPartialsType(torch.half)``: the accumulation of a matmul (``mm``,
  ``addmm``, ``bmm``, ``baddbmm``) in float16 partials: the product over each
  :data:`PARTIALS_CHUNK` input channels (the AMP's input-channel group in float16,
  :mod:`collectives.performance.compute_model`) computed in float32, rounded to float16 and
  added to a float16 running sum. Convolutions round once (ipupod does not split them).
  Slower than the default (a matmul per chunk); a precision study's setting.

**For other front ends.** The mode knows nothing of PopTorch: :func:`precision_mode` takes
the tensors that decide it and a partials type. The TensorFlow front end's mixed precision
(a Keras ``mixed_float16`` policy on CPU TensorFlow) can reuse the same rule once its ops
reach PyTorch-free code: compute each float16 op in float32 and round with the same
``round_half`` and the same partials rule; this module's :func:`round_half` and
:func:`matmul_half_partials` are plain functions of tensors for that purpose.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

__all__ = ["HalfAsFloat", "precision_mode", "partials_of", "round_half",
           "matmul_half_partials", "PARTIALS_CHUNK"]

#: Input channels per float16 partial sum under half partials: the AMP's input-channel group
#: in float16 (PopLibs: 4 halves a load x pipeline depth 4).
PARTIALS_CHUNK = 16

_aten = torch.ops.aten
_MATMULS = {_aten.mm.default: (0, 1), _aten.addmm.default: (1, 2), _aten.bmm.default: (0, 1),
            _aten.baddbmm.default: (1, 2)}
# casts and creations take their dtype from their arguments, views and metadata must alias
# their operand: these run as they are
_AS_IS = frozenset({_aten._to_copy.default, _aten.copy_.default, _aten.detach.default,
                    _aten.empty_like.default, _aten.zeros_like.default, _aten.ones_like.default,
                    _aten.full_like.default, _aten.clone.default})


def round_half(t):
    """``t`` rounded to float16 when it is a float32 tensor (anything else as it is)."""
    return t.to(torch.float16) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 \
        else t


def _up(t):
    if isinstance(t, torch.Tensor) and t.dtype == torch.float16:
        return t.float()
    return torch.float32 if t is torch.float16 else t  # (e.g. input_dtype= of a backward)


def matmul_half_partials(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (float32 operands, ``[..., M, K] x [..., K, N]``) accumulated in float16
    partials: the product of every :data:`PARTIALS_CHUNK` channels of ``K`` in float32,
    rounded to float16, added to a float16 running sum. Returns float16."""
    total = None
    for start in range(0, a.shape[-1], PARTIALS_CHUNK):
        part = torch.matmul(a[..., start:start + PARTIALS_CHUNK],
                            b[..., start:start + PARTIALS_CHUNK, :]).to(torch.float16)
        total = part if total is None else (total.float() + part.float()).to(torch.float16)
    return total


class HalfAsFloat(TorchDispatchMode):
    """Float16 operations computed in float32 and rounded to float16 (module docstring).

    Args:
        partials: ``"float"`` (round a matmul once) or ``"half"`` (float16 partials).

    Raises:
        ValueError: another partials type.
    """

    def __init__(self, partials: str = "float"):
        super().__init__()
        if partials not in ("float", "half"):
            raise ValueError(f"partials must be 'float' or 'half', got {partials!r}")
        self.partials = partials
        self._copies = _Float32Copies()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        info = _INFO.get(func)
        if info is None:
            info = _INFO[func] = (func in _AS_IS or bool(getattr(func, "is_view", False)),
                                  _writes(func))
        as_is, writes = info
        if as_is:
            if writes:  # (copy_ into a float16 tensor)
                self._forget_written(args)
            return func(*args, **(kwargs or {}))
        up_args, half = _up_all(args, self._copies)
        up_kwargs = kwargs
        if kwargs:
            values, half_kw = _up_all(tuple(kwargs.values()), self._copies)
            up_kwargs, half = dict(zip(kwargs, values)), half or half_kw
        if not half:
            return func(*args, **(kwargs or {}))
        if self.partials == "half" and func in _MATMULS:
            out = self._half_partials(func, up_args, up_kwargs or {})
        else:
            out = func(*up_args, **(up_kwargs or {}))
        if writes:  # an op that writes operands: its writes go into the float16 operands
            copied = {}
            for orig, new in _pairs(args, up_args, kwargs, up_kwargs):
                if isinstance(orig, torch.Tensor) and orig is not new:
                    orig.copy_(new)
                    copied[id(new)] = orig
            self._forget_written(args)  # (the op may have written their float32 copies)
            # a result that is a written operand (``add_``'s self, an ``out=``) is that
            # float16 operand; a new result (batch norm's output beside the running
            # statistics it updates) is rounded as any op's
            return tree_map(lambda t: copied[id(t)] if id(t) in copied else round_half(t),
                            out)
        if isinstance(out, torch.Tensor):
            return round_half(out)
        return tree_map(round_half, out)

    def _forget_written(self, args) -> None:
        for t in args:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float16:
                self._copies.forget(t)

    @staticmethod
    def _half_partials(func, args, kwargs):
        i, j = _MATMULS[func]
        product = matmul_half_partials(args[i], args[j]).float()
        if i == 0:
            return product
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        return beta * args[0] + alpha * product


def _pairs(args: tuple, up_args: tuple, kwargs, up_kwargs):
    """``(operand, its float32 stand-in)`` of every positional and keyword operand."""
    yield from zip(args, up_args)
    if kwargs:
        yield from ((kwargs[k], up_kwargs[k]) for k in kwargs)


def _writes(func) -> bool:
    return func in _UNMARKED_WRITES or any(a.alias_info is not None and a.alias_info.is_write
                                           for a in func._schema.arguments)


#: operations that write operands their schema does not mark as written: ``native_batch_norm``
#: updates ``running_mean`` and ``running_var`` in training (its schema has no ``(a!)``, unlike
#: ``_native_batch_norm_legit``'s)
_UNMARKED_WRITES = frozenset({_aten.native_batch_norm.default})


_INFO: dict = {}  # op -> (runs as it is, writes an operand)


class _Float32Copies:
    """The float32 copy of each float16 storage an operation has read, kept while the
    program still holds a tensor on that storage and until an operation writes it, so that a
    tensor read by several operations (an activation by the next layer and, as autograd's
    saved tensor, by its backward; a parameter by the forward, the backward and the
    optimizer; the views ``q``, ``k``, ``v`` of one projection) is converted once. The values
    read are exactly ``t.float()``'s: a tensor reads its copy at its own shape, strides and
    storage offset.

    Keyed by the storage's address while this holds a tensor on it (so the address cannot be
    reused); every :data:`_SWEEP` new copies, the storages that only this still holds are
    dropped (``torch._C._storage_Use_Count``), so the copies of a step's dead activations
    do not outlive them by long. A write through the mode forgets the storage's copy (and a
    changed ``_version``, any other in-place write, makes it stale)."""

    __slots__ = ("_by_ptr", "_added")

    def __init__(self) -> None:
        # storage address -> (a tensor on the storage, its _version, float32 copy, 1-D)
        self._by_ptr: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self._added = 0

    def forget(self, v: torch.Tensor) -> None:
        """Drop the copy of ``v``'s storage (an operation wrote ``v``)."""
        self._by_ptr.pop(v.untyped_storage().data_ptr(), None)

    def float32(self, v: torch.Tensor) -> torch.Tensor:
        """``v.float()`` (``v`` float16), from the kept copy of its storage."""
        storage = v.untyped_storage()
        ptr = storage.data_ptr()
        if not ptr:  # (an empty storage)
            return v.float()
        entry = self._by_ptr.get(ptr)
        if entry is None or entry[1] != v._version:
            flat = torch.empty(0, dtype=torch.float16).set_(storage)
            entry = self._by_ptr[ptr] = (v.detach(), v._version, flat.float())
            self._added += 1
            if self._added % _SWEEP == 0:
                self._sweep()
        return entry[2].as_strided(v.shape, v.stride(), v.storage_offset())

    def _sweep(self) -> None:
        use_count = torch._C._storage_Use_Count
        for ptr in [ptr for ptr, (held, _, _) in self._by_ptr.items()
                    if use_count(held.untyped_storage()._cdata) <= 2]:  # (held + this call)
            del self._by_ptr[ptr]


#: New float32 copies between two sweeps of the dead ones.
_SWEEP = 16


def _up_all(values: tuple, copies: _Float32Copies) -> tuple[tuple, bool]:
    """``values`` with float16 tensors (and lists of them, and float16 dtypes) made float32
    (through ``copies``); whether any float16 tensor was there."""
    out, half = [], False
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.dtype == torch.float16:
                half = True
                v = copies.float32(v)
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            if any(t.dtype == torch.float16 for t in v if isinstance(t, torch.Tensor)):
                v, half = type(v)(_up(t) for t in v), True
        elif v is torch.float16:
            v = torch.float32
        out.append(v)
    return tuple(out), half


def partials_of(popart_options: dict) -> str:
    """``"float"`` or ``"half"``: PopART's ``partialsTypeMatMuls`` as
    ``Precision.setPartialsType`` set it (default float)."""
    return "half" if popart_options.get("partialsTypeMatMuls") == "half" else "float"


def precision_mode(tensors: Iterable[torch.Tensor], partials: str = "float"):
    """A :class:`HalfAsFloat` mode when any of ``tensors`` (a model's parameters and buffers,
    its inputs) is float16, else a context that does nothing."""
    if any(isinstance(t, torch.Tensor) and t.dtype == torch.float16 for t in tensors):
        return HalfAsFloat(partials)
    return contextlib.nullcontext()
