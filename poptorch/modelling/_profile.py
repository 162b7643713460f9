"""What a model costs, counted once at compile from the real PyTorch operations of one
micro-batch (the input signature is fixed from then on: poptorch reference §3.2).

:func:`profile_forward` runs replica 0's first micro-batch through a discovering
:class:`~poptorch.pipelining._stage_trace.StageTrace` and counts, per stage (segment):

* FLOPs of the forward and (training) of each stage's backward pass, counted as PyTorch's
  ``torch.utils.flop_counter.FlopCounterMode`` counts them (its ``flop_registry`` and its rule
  of decomposing the operations the registry does not know; matrix products, convolutions and
  attention; element-wise operations count 0), by :class:`FlopCount`, the same dispatch mode
  without the counter's module tracking (whose hooks would run operations of their own in
  the model's forward pass);
* the activations kept for backward: the tensors autograd saves
  (``torch.autograd.graph.saved_tensors_hooks``), each storage once, parameters and buffers
  left out; the largest piece between two ``recomputationCheckpoint``\\s; the checkpointed
  tensors;
* the bytes entering it (tensors of earlier stages and the model's inputs), the bytes it
  sends to each later stage and (training) receives back as gradients, the largest operation
  (operands and result, parameters left out: the working memory of inference);
* the parameters and buffers it uses first (they live on its IPU), the float dtype it computes
  in, the recorded notes (``set_available_memory``, ``MultiConv``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from collectives.performance.compute_model import ComputeProfile
from poptorch._nest import flatten
from poptorch.modelling._op_ledger import OpLedger
from poptorch.pipelining._stage_trace import StagePlan, StageTrace
from poptorch.pipelining._strategies import ExecutionStrategy
from poptorch._forward_pass import ForwardPass
from poptorch._replica_rng import ReplicaRNG

__all__ = ["StageCounts", "ModelProfile", "profile_forward", "FlopCount"]

#: size and layout queries FlopCounterMode leaves to the next mode
_QUERIES = frozenset(getattr(torch.ops.aten, name).default for name in (
    "sym_is_contiguous", "is_contiguous", "is_strides_like_format",
    "is_non_overlapping_and_dense", "size", "sym_size", "stride", "sym_stride",
    "storage_offset", "sym_storage_offset", "numel", "sym_numel", "dim")
    if hasattr(torch.ops.aten, name)) | {torch.ops.aten.is_contiguous.memory_format,
                                        torch.ops.prim.layout.default}


class FlopCount(TorchDispatchMode):
    """FLOPs of the ATen operations run while active (:attr:`total`), as
    ``FlopCounterMode`` counts them (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def get_total_flops(self) -> int:
        return self.total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _QUERIES:
            return NotImplemented
        if func not in flop_registry and func is not torch.ops.prim.device.default:
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            self.total += count(*args, **kwargs, out_val=out)
        return out


@dataclass
class StageCounts:
    """One stage's counts for one micro-batch (bytes, FLOPs).

    Attributes:
        forward_flops, backward_flops: FLOPs of its forward and backward passes.
        saved_bytes: activations autograd keeps for its backward pass.
        piece_saved_bytes: the most of those between two recomputation checkpoints (all of
            them without checkpoints).
        checkpoint_bytes: its ``recomputationCheckpoint`` tensors.
        input_bytes: tensors of earlier stages and model inputs it uses (its stash under
            recomputation).
        host_input_bytes: the model inputs it uses first (from the host).
        peak_op_bytes: the largest operation's operands and result (no parameters).
        params: names of the parameters it uses first; ``param_bytes``, ``buffer_bytes``
            (parameters that need no gradient count as buffers).
        trainable_bytes: bytes of its parameters that take gradients.
        dtype: the float dtype it computes in (its first parameter's, else its inputs').
        ops: PyTorch operations it ran.
        notes: recorded-only annotations: ``(kind, value)``.
        forward_ops, backward_ops: the leaf ATen operations of its forward and backward
            passes (:class:`~collectives.performance.compute_model.ComputeProfile`, from
            :class:`poptorch.modelling._op_ledger.OpLedger`): what the per-operation compute model prices.
    """

    forward_flops: float = 0.0
    backward_flops: float = 0.0
    saved_bytes: int = 0
    piece_saved_bytes: int = 0
    checkpoint_bytes: int = 0
    input_bytes: int = 0
    host_input_bytes: int = 0
    peak_op_bytes: int = 0
    params: list = field(default_factory=list)
    param_bytes: int = 0
    buffer_bytes: int = 0
    trainable_bytes: int = 0
    dtype: str = ""
    ops: int = 0
    notes: list = field(default_factory=list)
    forward_ops: ComputeProfile = field(default_factory=ComputeProfile)
    backward_ops: ComputeProfile = field(default_factory=ComputeProfile)


@dataclass
class ModelProfile:
    """The counts of a model (per micro-batch) and its stages.

    Attributes:
        plan: the stages.
        stages: a :class:`StageCounts` per stage.
        copies: ``(src, dst) -> bytes`` of activations sent forward between stages.
        grad_copies: ``(src, dst) -> bytes`` of gradients sent back (src the later stage).
        output_bytes: bytes of the forward's outputs; ``output_stage``: the stage that makes
            the most of them.
        loss_stage: the stage of the loss (training), else None.
        partials: the AMP's partial-sum type the compute model prices matmuls and
            convolutions with: ``"float32"`` (PopART's default) or ``"float16"``
            (``Precision.setPartialsType(torch.half)``); the executor sets it at compile.
    """

    plan: StagePlan
    stages: list[StageCounts]
    copies: dict = field(default_factory=dict)
    grad_copies: dict = field(default_factory=dict)
    output_bytes: int = 0
    output_stage: int = 0
    loss_stage: int | None = None
    partials: str = "float32"

    @property
    def forward_flops(self) -> float:
        return sum(s.forward_flops for s in self.stages)

    @property
    def backward_flops(self) -> float:
        return sum(s.backward_flops for s in self.stages)


class _Profiler:
    """The observer of a discovering StageTrace (and the saved-tensor hooks)."""

    def __init__(self, module: torch.nn.Module, inputs: list[torch.Tensor],
                 counter: FlopCount, ledger: OpLedger):
        self.counter, self.ledger = counter, ledger
        self.stages: list[StageCounts] = [StageCounts()]
        self._flops_at = 0.0
        self._ops_at = 0
        self._params = {id(p): (n, p) for n, p in module.named_parameters()}
        self._buffers = {id(b): (n, b) for n, b in module.named_buffers() if b is not None}
        self._param_ptrs = {t.untyped_storage().data_ptr()
                            for _, t in list(self._params.values()) + list(self._buffers.values())}
        self._inputs = {id(t) for t in inputs}
        self._placed: set[int] = set()
        self._seen_inputs: set[tuple[int, int]] = set()
        self._from_host: set[int] = set()
        self._saved: list[set] = [set()]
        self._piece = [0]
        self._args_bytes = 0
        self.segment_of_trace = lambda: 0

    def _stage(self, segment: int) -> StageCounts:
        while len(self.stages) <= segment:
            self.stages.append(StageCounts())
            self._saved.append(set())
            self._piece.append(0)
        return self.stages[segment]

    def _close_forward(self, segment: int) -> None:
        now = self.counter.get_total_flops()
        self._stage(segment).forward_flops += now - self._flops_at
        self._flops_at = now
        stage = self._stage(segment)
        stage.forward_ops = stage.forward_ops + self.ledger.since(self._ops_at)
        self._ops_at = self.ledger.mark()

    def switch(self, segment: int) -> None:
        self._close_forward(segment - 1)
        self._stage(segment)

    def op(self, segment: int, args: tuple, kwargs: dict) -> None:
        stage = self._stage(segment)
        stage.ops += 1
        nbytes = 0
        for t in _tensors(args, kwargs):
            key = id(t)
            owner = self._params.get(key) or self._buffers.get(key)
            if owner is not None:
                if key not in self._placed:
                    self._placed.add(key)
                    name, p = owner
                    trainable = isinstance(p, torch.nn.Parameter) and p.requires_grad
                    stage.params.append(name)
                    if trainable:
                        stage.param_bytes += p.nbytes
                        stage.trainable_bytes += p.nbytes
                    else:
                        stage.buffer_bytes += p.nbytes
                    if not stage.dtype and p.is_floating_point():
                        stage.dtype = _dtype_name(p.dtype)
                continue
            nbytes += t.nbytes
            if key in self._inputs and (key, segment) not in self._seen_inputs:
                self._seen_inputs.add((key, segment))
                if key not in self._from_host:
                    self._from_host.add(key)
                    stage.host_input_bytes += t.nbytes
                stage.input_bytes += t.nbytes
            if not stage.dtype and t.is_floating_point():
                stage.dtype = _dtype_name(t.dtype)
        self._args_bytes = nbytes

    def result(self, segment: int, out: Any) -> None:
        nbytes = self._args_bytes + sum(t.nbytes for t in _tensors((out,), {}))
        stage = self._stage(segment)
        stage.peak_op_bytes = max(stage.peak_op_bytes, nbytes)

    def checkpoint(self, segment: int, tensors: tuple) -> None:
        stage = self._stage(segment)
        stage.checkpoint_bytes += sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))
        self._piece[segment] = 0  # a new piece of saved activations starts here

    def note(self, segment: int, kind: str, value: Any) -> None:
        self._stage(segment).notes.append((kind, value))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """saved_tensors_hooks' pack: count ``t`` in the current segment (once a storage)."""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._param_ptrs:
            segment = self.segment_of_trace()
            stage = self._stage(segment)
            key = (ptr, storage.nbytes())
            if key not in self._saved[segment]:
                self._saved[segment].add(key)
                stage.saved_bytes += storage.nbytes()
                self._piece[segment] += storage.nbytes()
                stage.piece_saved_bytes = max(stage.piece_saved_bytes, self._piece[segment])
        return t


def _tensors(args: tuple, kwargs: dict):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def profile_forward(module: torch.nn.Module, args: tuple, kwargs: dict, rng: ReplicaRNG,
                    strategy: ExecutionStrategy, training: bool
                    ) -> tuple[ModelProfile, Any, StageTrace]:
    """Run ``module(*args, **kwargs)`` once, discovering its stages and counting them
    (module docstring); in training also each stage's backward pass, last stage first (the
    parameters' ``.grad`` are put back as they were).

    Returns:
        ``(profile, output, trace)``: the trace knows the losses and random calls.

    Raises:
        poptorch.Error, AssertionError: the block rules (:mod:`poptorch.pipelining._strategies`,
            :class:`~poptorch.pipelining._stage_trace.StageTrace`); the loss rules in training.
    """
    inputs = [t for t in flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    grads = {p: p.grad for p in module.parameters()}
    counter, ledger = FlopCount(), OpLedger()
    profiler = _Profiler(module, inputs, counter, ledger)
    trace = StageTrace(rng, strategy, boundaries=True, observer=profiler)
    profiler.segment_of_trace = lambda: trace.segment
    try:
        with ledger, counter:  # the ledger outside: it sees the leaf operations
            with torch.autograd.graph.saved_tensors_hooks(profiler.pack, lambda t: t), \
                    ForwardPass(trace, grad=training):
                output = module(*args, **kwargs)
            profiler._close_forward(trace.segment)
            loss = trace.final_loss() if training else None
            if training:
                for segment in reversed(range(len(trace.segments))):
                    before, mark = counter.get_total_flops(), ledger.mark()
                    trace.backward(segment, loss, 1.0)
                    profiler._stage(segment).backward_flops = counter.get_total_flops() - before
                    profiler._stage(segment).backward_ops = ledger.since(mark)
    finally:
        for p, g in grads.items():
            p.grad = g
    loss_segment = trace.producer(loss) if loss is not None else None
    plan = StagePlan(trace.segments, dict(strategy_blocks(trace)), strategy.sharded,
                     trace.module_inputs if trace.cut_at_modules else None, loss_segment)
    stages = [profiler._stage(i) for i in range(plan.num_stages)]
    for stage in stages:
        stage.dtype = stage.dtype or "float32"
    profile = ModelProfile(plan, stages)
    for c in trace.crossings:
        profile.copies[(c.src, c.dst)] = profile.copies.get((c.src, c.dst), 0) + c.copy.nbytes
        stages[c.dst].input_bytes += c.copy.nbytes
        if c.copy.requires_grad:
            key = (c.dst, c.src)
            profile.grad_copies[key] = profile.grad_copies.get(key, 0) + c.copy.nbytes
    per_stage: dict[int, int] = {}
    for leaf in flatten(output)[0]:
        if isinstance(leaf, torch.Tensor):
            segment = trace.producer(leaf)
            segment = plan.num_stages - 1 if segment is None else segment
            per_stage[segment] = per_stage.get(segment, 0) + leaf.nbytes
    profile.output_bytes = sum(per_stage.values())
    profile.output_stage = max(per_stage, key=per_stage.get) if per_stage else \
        plan.num_stages - 1
    if loss is not None:
        profile.loss_stage = plan.num_stages - 1 if loss_segment is None else loss_segment
    return profile, output, trace


def strategy_blocks(trace: StageTrace) -> dict[str, int]:
    """block user id -> stage id of the blocks ``trace`` met."""
    return {block: seg.stage_id for seg in trace.segments for block in seg.blocks}
