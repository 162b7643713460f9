"""Every ATen operation of a pass as the per-operation compute model needs it (issue 30).

:class:`OpLedger` is a dispatch mode entered *outside* :class:`poptorch.modelling._profile.FlopCount`:
the counter decomposes the operations its registry does not know and runs the rest, so what
reaches the ledger are the *leaf* operations that run (its FLOPs counted by the same
``flop_registry``); it writes each as a
:class:`collectives.performance.compute_model.OpRecord`: matrix products
(``mm``, ``addmm``, ``bmm``, ``baddbmm``) with their ``(groups, M, K, N)``, convolutions and
their backward (input and weight gradients) as implicit matrix products, and every other
operation by the bytes it reads and writes, sorted into element-wise, normalisation,
reduction and data movement; views cost nothing. The profiler of
:mod:`poptorch.modelling._profile` takes the records of each stage's forward and backward pass
(:meth:`OpLedger.since`); :mod:`poptorch.modelling._modelled` prices them on the system's chip.
"""

from __future__ import annotations

import math

import torch

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from collectives.performance.compute_model import ComputeProfile, OpRecord

__all__ = ["OpLedger", "describe"]

_NORMALISATION = frozenset({
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "native_batch_norm_backward",
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
    "native_group_norm_backward", "_softmax", "_softmax_backward_data", "_log_softmax",
    "_log_softmax_backward_data", "_batch_norm_with_update", "batch_norm_backward"})
#: Batch norms that compute statistics over the batch in training: name -> (index of the
#: training flag in the ATen schema, None: always training; index of the normalised input,
#: ``[N, C, ...]``).
_BATCH_STATISTICS = {
    "native_batch_norm": (5, 0), "_native_batch_norm_legit": (5, 0),
    "_native_batch_norm_legit_functional": (5, 0), "_batch_norm_with_update": (None, 0),
    "native_batch_norm_backward": (7, 1), "batch_norm_backward": (7, 1)}
_REDUCTION = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean",
    "argmax", "argmin", "norm", "linalg_vector_norm", "prod", "any", "all", "cumsum",
    "nll_loss_forward", "nll_loss2d_forward", "logsumexp"})
_DATA_MOVEMENT = frozenset({
    "copy_", "clone", "_to_copy", "cat", "stack", "index", "index_select", "embedding",
    "embedding_dense_backward", "gather", "scatter", "scatter_add", "index_put",
    "index_put_", "index_add", "constant_pad_nd", "repeat", "nll_loss_backward",
    "nll_loss2d_backward", "_unsafe_index", "select_backward", "slice_backward",
    "new_zeros", "flip", "roll"})
_FREE = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                   "lift_fresh", "detach", "alias", "_local_scalar_dense", "is_same_size",
                   "_unsafe_view"})
_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm"})


def _dtype(tensors) -> str:
    for t in tensors:
        if t.is_floating_point():
            return "float16" if t.dtype in (torch.float16, torch.bfloat16) else "float32"
    return "float32"


def _leaves(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)


def describe(func, args: tuple, kwargs: dict, out, flops: float) -> list[OpRecord]:
    """The :class:`OpRecord` objects of one leaf ATen operation (a convolution's backward gives
    one per gradient it makes; an operation that makes no tensor, none)."""
    name = func._overloadpacket.__name__
    inputs = list(_leaves((args, kwargs)))
    outputs = list(_leaves(out))
    nbytes = sum(t.nbytes for t in inputs) + sum(t.nbytes for t in outputs)
    dtype = _dtype(inputs + outputs)
    if name in _MATMULS:
        a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
        g = a.shape[0] if a.dim() == 3 else 1
        return [OpRecord(name, "matmul", dtype, (g, a.shape[-2], a.shape[-1], b.shape[-1]),
                         nbytes, flops)]
    if name == "convolution":
        x, w = args[0], args[1]
        groups = args[8] if len(args) > 8 else 1
        m = out.shape[0] * math.prod(out.shape[2:])
        return [OpRecord(name, "conv", dtype, (groups, m, w.shape[1], math.prod(w.shape[2:]),
                                               w.shape[0] // groups), nbytes, flops)]
    if name == "convolution_backward":
        grad_out, x, w = args[0], args[1], args[2]
        groups = args[9] if len(args) > 9 else 1
        mask = args[10] if len(args) > 10 else (True, True, True)
        kernel = math.prod(w.shape[2:])
        cin, cout = w.shape[1], w.shape[0] // groups
        records, share = [], flops / max(1, sum(bool(b) for b in mask[:2]))
        if mask[0]:  # grad input: [B x in positions, C_out x kernel] x [.., C_in]
            records.append(OpRecord("convolution_backward (input)", "conv", dtype,
                                    (groups, x.shape[0] * math.prod(x.shape[2:]), cout, kernel,
                                     cin), nbytes, share))
        if mask[1]:  # grad weight: [C_in x kernel, B x out positions] x [.., C_out]
            positions = grad_out.shape[0] * math.prod(grad_out.shape[2:])
            records.append(OpRecord("convolution_backward (weight)", "matmul", dtype,
                                    (groups, cin * kernel, positions, cout), nbytes, share))
        return records
    if not outputs or name in _FREE or getattr(func, "is_view", False):
        return [OpRecord(name, "view", dtype)] if outputs else []
    if flops:  # a FLOP-counted op ipupod has no shape rule for: its FLOPs at peak
        return [OpRecord(name, "matmul", dtype, (), nbytes, flops)]
    kind = ("normalisation" if name in _NORMALISATION else "reduction" if name in _REDUCTION
            else "data movement" if name in _DATA_MOVEMENT else "elementwise")
    return [OpRecord(name, kind, dtype, _batch_statistics(name, args), nbytes, 0.0)]


def _batch_statistics(name: str, args: tuple) -> tuple:
    """``(channels,)`` of a batch norm that computes statistics over its batch (training:
    forward and backward, whose per-channel sums a distributed batch norm all-reduces over
    replicas), else ``()``."""
    where = _BATCH_STATISTICS.get(name)
    if where is None:
        return ()
    flag, data = where
    if flag is not None and not (len(args) > flag and args[flag]):
        return ()  # evaluation: running statistics, nothing computed over the batch
    x = args[data]
    return (int(x.shape[1]),) if isinstance(x, torch.Tensor) and x.dim() > 1 else ()


class OpLedger(TorchDispatchMode):
    """Records every operation that reaches it (module docstring): :attr:`records` in
    order. Enter it outside the FLOP counter (``with ledger, counter:``)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        flops = count(*args, **kwargs, out_val=out) if count is not None else 0
        self.records.extend(describe(func, args, kwargs, out, flops))
        return out

    def mark(self) -> int:
        """Where the records are now (for :meth:`since`)."""
        return len(self.records)

    def since(self, mark: int) -> ComputeProfile:
        """The :class:`ComputeProfile` of the records after ``mark``."""
        return ComputeProfile.of(self.records[mark:])
