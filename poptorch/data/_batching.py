"""PopTorch's batch arithmetic (poptorch reference §3): which rows of a call's inputs each
micro-batch gets, and the outputs a call returns for each ``OutputMode``.

Inputs: every tensor argument's first dimension is ``N x B`` with ``N = di x (R / k) x G``;
row ``i`` belongs to device iteration ``i // (G S B)``, accumulation step
``(i // (S B)) % G``, input slot ``(i // B) % S`` and position ``i % B`` (``S = R / k`` slots;
the replicas of one input group share a slot) - PopART's ``[di, G, S, B, ...]``.

Outputs: with ``P = R x di x G`` micro-batch results per output, a mode keeps ``b`` of them
(``All`` P, ``EveryN(n)`` P / n, ``Final`` and ``Sum`` R) and concatenates them along dim 0
(a 0-d result becomes ``[1]`` first) when ``b > 1``; ``long`` comes back as ``int32`` and
``float64`` as ``float32``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from poptorch import enums
from poptorch._errors import createPoptorchError
from poptorch._nest import flatten

__all__ = ["Layout", "check_batch", "MicroBatches", "OutputCollector"]


class Layout:
    """The batch layout of one model: ``di`` device iterations, ``G`` accumulation steps,
    ``R`` local replicas in ``S = R // k`` input slots (group type Consecutive or
    Orthogonal)."""

    def __init__(self, di: int, G: int, R: int, k: int = 1,
                 group_type: enums.CommGroupType = enums.CommGroupType.Consecutive):
        self.di, self.G, self.R, self.k = di, G, R, k
        self.S = R // k
        self.group_type = group_type

    @property
    def factor(self) -> int:
        """N = di x S x G: micro-batches in the first dimension of every input."""
        return self.di * self.S * self.G

    def slot(self, replica: int) -> int:
        """The input slot of local replica ``replica``."""
        if self.k == 1:
            return replica
        if self.group_type == enums.CommGroupType.Orthogonal:
            return replica % self.S
        return replica // self.k


def _batch_message(shape, size: int, layout: Layout) -> str:
    return (f"Invalid batch dimension: In the input {shape}, the batch dimension ({size}) "
            f"must be a multiple of Options.deviceIterations({layout.di}) * "
            f"(Options.replicationFactor({layout.R}) / "
            f"Options.inputReplicaGrouping.input_group_size({layout.k})) * "
            f"Options.Training.gradientAccumulation({layout.G}) = {layout.factor} because it "
            "is used to calculate the batch size which will be executed on the device in any "
            "given iteration. For a full explanation see the batching semantics page of the "
            "documentation.")


def check_batch(args: tuple, kwargs: dict, layout: Layout) -> None:
    """Every tensor input's first dimension is a multiple of N (a 0-d tensor counts as 1).

    Raises:
        AssertionError: PopTorch's "Invalid batch dimension: ..." message.
    """
    for leaf in flatten((args, kwargs))[0]:
        if isinstance(leaf, torch.Tensor):
            size = leaf.shape[0] if leaf.dim() else 1
            if size % layout.factor or size == 0:
                raise AssertionError(_batch_message(leaf.shape, size, layout))


class MicroBatches:
    """The micro-batches of one call's inputs, each tensor a fresh contiguous copy (the
    same memory alignment at every layout).

    ``get(d, g, r)``: ``(args, kwargs)`` of device iteration d, accumulation step g, local
    replica r. Non-tensor arguments are given to every micro-batch as they are.
    """

    def __init__(self, args: tuple, kwargs: dict, layout: Layout):
        self.layout = layout
        leaves, self._rebuild = flatten((tuple(args), dict(kwargs)))
        self._views = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                t = leaf.detach()
                if t.requires_grad:
                    t = t.detach()
                t = t.reshape(1) if t.dim() == 0 else t
                self._views.append(t.reshape(layout.di, layout.G, layout.S, -1, *t.shape[1:]))
            else:
                self._views.append(leaf)

    def get(self, d: int, g: int, r: int) -> tuple[tuple, dict]:
        slot = self.layout.slot(r)
        leaves = [v[d, g, slot].clone(memory_format=torch.contiguous_format)
                  if isinstance(v, torch.Tensor) else v for v in self._views]
        args, kwargs = self._rebuild(leaves)
        return args, kwargs


def _cast(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.long:
        return t.to(torch.int32)
    if t.dtype == torch.float64:
        return t.to(torch.float32)
    return t


class OutputCollector:
    """Keeps what ``mode`` returns of the micro-batch results of one call.

    Args:
        layout: the batch layout.
        mode: the (resolved) output mode; never ``Default``.
        period: N of ``EveryN``.

    Raises:
        poptorch.Error: an ``EveryN`` period larger than or not dividing ``di``.
    """

    def __init__(self, layout: Layout, mode: enums.OutputMode, period: int = 1):
        if mode == enums.OutputMode.EveryN:
            if period > layout.di:
                raise createPoptorchError("Return period must be <= to the number of batches "
                                          "per step")
            if layout.di % period:
                raise createPoptorchError("Return period must be a factor of the number of "
                                          "batches per step")
        self.layout, self.mode, self.period = layout, mode, period
        self._every = mode in (enums.OutputMode.All, enums.OutputMode.Sum)
        self._final = mode == enums.OutputMode.Final
        self._kept: dict[tuple[int, int, int], list] = {}
        self._sums: dict[int, list] = {}
        self._rebuild: Callable | None = None

    def wants(self, d: int, g: int) -> bool:
        """Whether the results of device iteration d, step g are kept (else skip them)."""
        if self._every:
            return True
        if self._final:
            return d == self.layout.di - 1 and g == self.layout.G - 1
        return (d + 1) % self.period == 0

    def add(self, d: int, g: int, r: int, output: Any) -> None:
        """Keep replica r's result of (d, g) (call only when :meth:`wants`)."""
        leaves, rebuild = flatten(output)
        if self._rebuild is None:
            self._rebuild = rebuild
        leaves = [x.detach() if isinstance(x, torch.Tensor) else x for x in leaves]
        if self.mode == enums.OutputMode.Sum:
            acc = self._sums.get(r)
            self._sums[r] = leaves if acc is None else [
                a + x if isinstance(x, torch.Tensor) else a for a, x in zip(acc, leaves)]
        else:
            self._kept[(d, g, r)] = leaves

    def result(self) -> Any:
        """The call's outputs, in the model's output structure (None without outputs)."""
        if self._rebuild is None:
            return None
        L = self.layout
        if self.mode in (enums.OutputMode.Sum, enums.OutputMode.Final):
            rows = ([self._sums[r] for r in range(L.R)] if self.mode == enums.OutputMode.Sum
                    else [self._kept[(L.di - 1, L.G - 1, r)] for r in range(L.R)])
        else:
            rows = [self._kept[k] for k in sorted(self._kept)]
        columns = list(zip(*rows))
        out = []
        for column in columns:
            first = column[0]
            if not isinstance(first, torch.Tensor):
                out.append(first)  # a host-side constant: b = 1
            elif len(column) == 1:
                out.append(_cast(first))
            else:
                out.append(_cast(torch.cat([x.reshape(1) if x.dim() == 0 else x
                                            for x in column])))
        return self._rebuild(out)
