"""One forward pass of a model cut into stages (poptorch reference §7), seen op by op.

:class:`StageTrace` extends :class:`poptorch._tracing.Trace` (losses, the replica's random
numbers) with the blocks: it is the forward pass the annotations of
:mod:`poptorch.pipelining._blocks` talk to (entered by a
:class:`poptorch._forward_pass.ForwardPass`, which owns the thread state of the pass). The
forward is cut into *segments*, one per stage it runs in, in the order it runs them (a
pipelined model's stage ids must grow along the forward; a sharded one may come back
to an IPU, each visit its own segment).

With ``boundaries`` (training), a tensor made in one segment and used by a later one reaches
it as a detached copy (``detach().requires_grad_()``, one per tensor and segment): each
segment's operations form an autograd graph of their own, and :meth:`backward` runs one
segment's backward pass from the gradients its copies received (plus the loss, in its
segment). The forward values are those of the unsplit model; the gradients of each segment's
parameters are computed by the same operations from the same values.

Where a module's ``BeginBlock`` begins a segment, its inputs of earlier segments cross right
there (its forward pre-hook hands the module their copies, :meth:`StageTrace.begin_module`).
When every crossing of the compiled forward was such an input (``StagePlan.module_inputs``:
the graphs cut between modules, as ``torch.distributed.pipelining`` cuts a model into stage
modules) and nothing else needs recording, a training forward intercepts no op: the hooks
cut the graphs where the plan says, with the same copies, so the same numbers (a forward that
then used an earlier stage's tensor elsewhere, unlike the compiled one, would run its
gradient through that stage's graph early). Otherwise every op is intercepted and a tensor
crosses wherever an op of a later segment uses it.

Two modes:

* **discovering** (``plan=None``, once at compile): blocks are resolved by the options'
  strategy and the segments recorded (:attr:`segments`); ``observer`` (the compile-time
  :class:`poptorch.modelling._profile.Profiler`) sees every op, segment switch, checkpoint and
  memory
  note;
* **running** (``plan`` given): the blocks are looked up in the compiled plan, the forward
  must take the same segments, and ``on_switch(segment)`` is called before each segment after
  the first (a pipeline's scheduler pauses the forward there until that stage's pass).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from poptorch._errors import createPoptorchError
from poptorch.pipelining._strategies import DEFAULT_STAGE, ExecutionStrategy
from poptorch._replica_rng import ReplicaRNG
from poptorch._tracing import Trace

__all__ = ["StageTrace", "StagePlan", "Segment", "Crossing"]


class Segment:
    """One stage of the forward pass: its stage id, the replica's IPU index, its blocks."""

    __slots__ = ("stage_id", "ipu", "blocks")

    def __init__(self, stage_id: int, ipu: int, blocks: tuple[str, ...] = ()):
        self.stage_id, self.ipu, self.blocks = stage_id, ipu, tuple(blocks)

    def __repr__(self) -> str:
        return f"Segment(stage {self.stage_id}, IPU {self.ipu}, blocks {list(self.blocks)})"


class StagePlan:
    """The stages of a model as compiled: its segments in forward order, the stage id of
    each block, whether sharded (read-only once made).

    Attributes:
        segments: the stages, in the order the forward runs them.
        block_stage: block user id -> stage id.
        sharded: ``ShardedExecution`` (stages one after another), else a pipeline.
        module_inputs: where every tensor that crossed into a later segment of the compiled
            forward was an input of the module whose ``BeginBlock`` began that segment (and
            used there only through it): per segment, ``(position, source segment)`` of each
            such input; None where some tensor crossed elsewhere (the forward is then
            followed op by op).
        loss_segment: the segment that made the final loss (training; None: not made in
            the forward pass).
    """

    def __init__(self, segments: list[Segment], block_stage: dict[str, int], sharded: bool,
                 module_inputs: dict[int, tuple[tuple[int, int], ...]] | None = None,
                 loss_segment: int | None = None):
        self.segments = tuple(segments)
        self.block_stage = dict(block_stage)
        self.sharded = sharded
        self.module_inputs = None if module_inputs is None else dict(module_inputs)
        self.loss_segment = loss_segment

    @property
    def num_stages(self) -> int:
        return len(self.segments)

    @property
    def ipus(self) -> tuple[int, ...]:
        """The replica IPU index of each stage."""
        return tuple(s.ipu for s in self.segments)

    @property
    def ipus_used(self) -> int:
        """IPUs a replica needs: the highest IPU index plus one (poptorch reference §5.6)."""
        return max(self.ipus) + 1


class Crossing:
    """A tensor of segment ``src`` used by segment ``dst``, and its copy there."""

    __slots__ = ("src", "dst", "tensor", "copy")

    def __init__(self, src: int, dst: int, tensor: torch.Tensor, copy: torch.Tensor):
        self.src, self.dst, self.tensor, self.copy = src, dst, tensor, copy


class _Producers:
    """The segment that made each tensor of a forward pass, by identity, without keeping the
    tensors alive (a dead tensor's id may come back on a new one: its entry is then stale).

    ``torch.utils.weak.WeakIdKeyDictionary`` does the same but builds a weak reference object
    in Python for every lookup, and every op's tensor arguments are looked up.

    Attributes:
        by_id: ``id(tensor) -> (weak reference, segment)``; the per-op path of
            :class:`StageTrace` reads and writes it directly (a method call per tensor of
            every op was a measurable share of a pipelined step).
    """

    __slots__ = ("by_id",)

    def __init__(self) -> None:
        self.by_id: dict[int, tuple[weakref.ref, int]] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, t: torch.Tensor) -> int | None:
        entry = self.by_id.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def __setitem__(self, t: torch.Tensor, segment: int) -> None:
        self.by_id[id(t)] = (weakref.ref(t), segment)


class _Cancelled(BaseException):
    """Unwinds a paused forward pass whose step failed elsewhere."""


class StageTrace(Trace):
    """The forward pass of one micro-batch (module docstring).

    Args:
        rng: the replica's random state (None: PyTorch's default generator).
        strategy: the options' execution strategy (used while discovering).
        plan: the compiled stages (None: discover them).
        boundaries: detach the tensors that cross segments (training).
        on_switch: called with the new segment index before each segment after the first
            (running only).
        observer: sees the ops, switches and notes (discovering only).
        intercept: see every op (a ``TorchFunctionMode``): needed to find the loss, to
            route random numbers, to discover, and to cut boundaries anywhere in the forward;
            without it only the blocks are followed (cheaper), and with ``boundaries`` the
            tensors cross where the plan's ``module_inputs`` say, at the inputs of the
            modules that begin the segments.

    Attributes:
        module_inputs: discovering: per segment begun by a module's ``BeginBlock``, the
            ``(position, source segment)`` of each of its inputs that crossed.
        cut_at_modules: discovering: whether every crossing so far was such an input (no
            op of a later segment used an earlier segment's tensor otherwise).
    """

    def __init__(self, rng: ReplicaRNG | None, strategy: ExecutionStrategy,
                 plan: StagePlan | None = None, *, boundaries: bool = False,
                 on_switch: Callable[[int], None] | None = None, observer=None,
                 intercept: bool = True):
        super().__init__(rng)
        self.intercept = intercept or plan is None  # (Trace's attributes)
        self._at_modules = boundaries and not self.intercept
        if self._at_modules and plan.module_inputs is None:
            raise ValueError("StageTrace: boundaries without intercept need a plan cut at "
                             "the modules' inputs")
        self.follows_blocks = True
        self.strategy, self.plan = strategy, plan
        self.on_switch, self.observer = on_switch, observer
        self.segment = 0
        self._stage_id = DEFAULT_STAGE
        self._auto = 0
        self._producers = _Producers() if boundaries and self.intercept else None
        self._copies: dict[tuple[int, int], torch.Tensor] = {}
        self.crossings: list[Crossing] = []
        self.module_inputs: dict[int, tuple[tuple[int, int], ...]] = {}
        self.cut_at_modules = True
        if plan is None:
            self.segments = [Segment(DEFAULT_STAGE, strategy.default_ipu())]
            self._ops_in_first = 0
        else:
            self.segments = list(plan.segments)
            self._stage_id = plan.segments[0].stage_id

    # -- blocks (poptorch.pipelining._blocks) -------------------------------------------
    def next_auto_id(self) -> str:
        value = self._auto
        self._auto += 1
        return str(value)

    def reset_auto_id(self) -> None:
        self._auto = 0

    def begin_block(self, user_id: str, ipu_id: int | None) -> None:
        """Block ``user_id`` begins: a new segment when its stage differs.

        Raises:
            poptorch.Error: a pipelined model's stage going back; running: a block or a
                stage the compiled forward did not take.
            AssertionError: the strategy's errors (unknown block, no IPU for SameAsIpu).
        """
        if self.plan is None:
            stage_id, ipu = self.strategy.resolve(user_id, ipu_id)
        else:
            stage_id = self.plan.block_stage.get(user_id)
            if stage_id is None:
                raise createPoptorchError(
                    f"Block '{user_id}' did not run when the model was compiled (blocks: "
                    f"{sorted(self.plan.block_stage)}): the forward pass must take the same "
                    "blocks on every call")
            ipu = None
        if stage_id == self._stage_id:
            if self.plan is None and user_id not in self.segments[self.segment].blocks:
                seg = self.segments[self.segment]
                self.segments[self.segment] = Segment(seg.stage_id, seg.ipu,
                                                      seg.blocks + (user_id,))
            return
        sharded = self.strategy.sharded if self.plan is None else self.plan.sharded
        if stage_id < self._stage_id and not sharded:
            raise createPoptorchError(
                f"Block '{user_id}' is in pipeline stage {stage_id}, after stage "
                f"{self._stage_id} in the forward pass: the stages of a "
                "poptorch.PipelinedExecution must follow one another along the model (with "
                "poptorch.AutoStage.SameAsIpu a block may not go back to an earlier IPU; "
                "poptorch.ShardedExecution allows it)")
        self._switch(stage_id, ipu, user_id)

    def begin_module(self, user_id: str, ipu_id: int | None, inputs: tuple) -> tuple | None:
        """Block ``user_id`` begins with a call of its module (``BeginBlock``'s forward
        pre-hook): :meth:`begin_block`, then, where a new segment begins, the module's
        inputs made in earlier segments handed to it as their copies. Returns the inputs
        for the module (None: as they are).

        Raises:
            poptorch.Error: as :meth:`begin_block`; running cut at the modules' inputs: an
                input the compiled forward passed across that is no tensor now.
        """
        before = self.segment
        self.begin_block(user_id, ipu_id)
        if self.segment == before:
            return None
        if self._at_modules:
            return self._cross_at_module(inputs)
        if self._producers is None:
            return None
        depth = torch._C._len_torch_function_stack()
        if not depth or torch._C._get_function_stack_at(depth - 1) is not self:
            return None  # (another mode on top: the ops cross them, as elsewhere)
        torch._C._pop_torch_function_stack()  # (no op of the stage, as in the ops' handler)
        try:
            out, entries = list(inputs), []
            for i, t in enumerate(inputs):
                src = self._producers.get(t) if isinstance(t, torch.Tensor) else None
                if src is not None and src != self.segment:
                    if any(t is inputs[j] for j, _ in entries):
                        self.cut_at_modules = False  # (one copy for both: op by op)
                    out[i] = self._cross(t)
                    entries.append((i, src))
        finally:
            torch._C._push_on_torch_function_stack(self)
        if self.plan is None and entries:
            self.module_inputs[self.segment] = tuple(entries)
        return tuple(out) if entries else None

    def _cross_at_module(self, inputs: tuple) -> tuple | None:
        """The module's inputs with those the plan says cross replaced by their copies."""
        entries = self.plan.module_inputs.get(self.segment, ())
        if not entries:
            return None
        out = list(inputs)
        for i, src in entries:
            t = inputs[i] if i < len(inputs) else None
            if not isinstance(t, torch.Tensor):
                raise createPoptorchError(
                    f"The module that begins stage {self._stage_id} was given "
                    f"{type(t).__name__} as its input {i}, where the compiled forward pass "
                    "gave it a tensor of an earlier stage: the forward pass must take the "
                    "same path on every call")
            copy = t.detach()
            if t.requires_grad:
                copy.requires_grad_()
            self.crossings.append(Crossing(src, self.segment, t, copy))
            out[i] = copy
        return tuple(out)

    def _switch(self, stage_id: int, ipu: int | None, user_id: str) -> None:
        previous = self.segment
        if self.plan is None:
            if previous == 0 and self._ops_in_first == 0 and len(self.segments) == 1:
                self.segments[0] = Segment(stage_id, ipu, (user_id,))  # no op before it
            else:
                self.segments.append(Segment(stage_id, ipu, (user_id,)))
                self.segment += 1
            self._stage_id = stage_id
            if self.observer is not None and self.segment != previous:
                self.observer.switch(self.segment)
            return
        nxt = self.segment + 1
        if nxt >= len(self.segments) or self.segments[nxt].stage_id != stage_id:
            raise createPoptorchError(
                f"Block '{user_id}' begins stage {stage_id} where the compiled forward pass "
                f"ran {self.segments[nxt].stage_id if nxt < len(self.segments) else 'no'} "
                "stage: the forward pass must take the same stages on every call")
        self.segment, self._stage_id = nxt, stage_id
        if self.on_switch is not None:
            self.on_switch(nxt)

    # -- notes from poptorch's operations ------------------------------------------------
    def checkpoint(self, tensors: tuple) -> None:
        """``recomputationCheckpoint`` of ``tensors`` in the current segment."""
        if self.observer is not None:
            self.observer.checkpoint(self.segment, tensors)

    def note(self, kind: str, value: Any) -> None:
        """A recorded-only annotation (``set_available_memory``, ``MultiConv``)."""
        if self.observer is not None:
            self.observer.note(self.segment, kind, value)

    # -- every op ------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        producers = self._producers
        if producers is not None and producers.by_id:
            args = self._cross_all(args)
            if kwargs:
                kwargs = dict(zip(kwargs, self._cross_all(tuple(kwargs.values()))))
        discovering = self.plan is None and getattr(func, "__name__", "") != "__get__"
        if discovering:  # (a tensor's attribute read is no operation of a stage)
            if self.segment == 0:
                self._ops_in_first += 1
            if self.observer is not None:
                self.observer.op(self.segment, args, kwargs)
        out = super().__torch_function__(func, types, args, kwargs)
        if producers is not None:
            by_id, segment = producers.by_id, self.segment
            if isinstance(out, torch.Tensor):
                by_id[id(out)] = (weakref.ref(out), segment)
            elif isinstance(out, (tuple, list)):
                for o in out:
                    if isinstance(o, torch.Tensor):
                        by_id[id(o)] = (weakref.ref(o), segment)
        if discovering and self.observer is not None:
            self.observer.result(self.segment, out)
        return out

    def _cross_all(self, values: tuple) -> tuple:
        """``values`` with each tensor of an earlier segment replaced by its copy here (the
        same tuple when none is: the common case of parameters and this segment's
        tensors, told apart by one lookup each)."""
        by_id, segment = self._producers.by_id, self.segment
        out = None
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                entry = by_id.get(id(v))
                if entry is None or entry[1] == segment:
                    continue
                c = self._cross(v)
            elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
                c = type(v)(self._cross(x) if isinstance(x, torch.Tensor) else x for x in v)
                c = v if all(a is b for a, b in zip(c, v)) else c
            else:
                continue
            if c is not v:
                self.cut_at_modules = False  # (an op, not a block's module, took it across)
                if out is None:
                    out = list(values)
                out[i] = c
        return values if out is None else tuple(out)

    def _cross(self, t: torch.Tensor) -> torch.Tensor:
        src = self._producers.get(t)
        if src is None or src == self.segment:
            return t
        key = (id(t), self.segment)
        copy = self._copies.get(key)
        if copy is None:
            copy = t.detach()
            if t.requires_grad:
                copy.requires_grad_()
            self._copies[key] = copy
            self._producers[copy] = self.segment
            self.crossings.append(Crossing(src, self.segment, t, copy))
        return copy

    # -- backward ------------------------------------------------------------------------
    def producer(self, t: torch.Tensor) -> int | None:
        """The segment that made ``t`` (None: not made in this forward pass)."""
        return self._producers.get(t) if self._producers is not None else None

    def backward(self, segment: int, loss: torch.Tensor | None, loss_scaling: float) -> None:
        """Segment ``segment``'s backward pass: from ``loss`` (when made there, scaled) and
        from the gradients its tensors' copies in later segments received. Gradients
        accumulate into the parameters' ``.grad`` and the copies' (for earlier segments)."""
        roots, grads = [], []
        if loss is not None and segment == (self.plan.loss_segment if self._at_modules
                                            else self.producer(loss)):
            if loss_scaling != 1.0:
                loss = loss * loss_scaling
            roots.append(loss)
            grads.append(None if loss.dim() == 0 else torch.ones_like(loss))
        for c in self.crossings:
            if c.src == segment and c.copy.grad is not None:
                roots.append(c.tensor)
                grads.append(c.copy.grad)
        if roots:
            torch.autograd.backward(roots, grads)
