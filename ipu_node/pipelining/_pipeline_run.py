"""The pipeline runtime: runs a checked :class:`~ipu_node.pipelining._pipeline_check.PipelinePlan`
pass by pass in the schedule's order, accumulates gradients, applies the optimizer, feeds
the outfeed, and lays every pass on the IPUs' modelled timelines (BSP steps).

Data flow between passes: a pass only consumes what passes of earlier steps produced (the
closed forms guarantee it), so the order of passes inside a step changes no number.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ipu_node import clock as _clock
from ipu_node.execution import loops
from ipu_node.pipelining._pipeline_check import PipelinePlan
from ipu_node.pipelining._pipeline_report import PipelineReport, StepRecord
from ipu_node.pipelining.pricing import PipelinePricer
from ipu_node.pipelining.scheduler import PipelineScheduler
from ipu_node.pipelining.schedules import stash_depths
from ipu_node.pipelining._pipeline_types import Stage
from ipu_node.pipelining._pipeline_wu import WeightUpdate, nbytes_of
from ipu_node.runtime.system import get_system

__all__ = ["run_pipeline"]


def _first_float_dtype(value: Any):
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype if value.dtype.kind == "f" else None
    items = value.values() if isinstance(value, dict) else (
        value if isinstance(value, (list, tuple)) else ())
    for v in items:
        found = _first_float_dtype(v)
        if found is not None:
            return found
    return None


def as_call(value: Any) -> tuple[tuple, dict]:
    """How a stage output (or infeed element) is passed on: a tuple or list positionally, a
    dict of str keys as keyword arguments, None as nothing, anything else as one argument
    ([004:4009-4013])."""
    if value is None:
        return (), {}
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return (), dict(value)
    return (value,), {}


def _flops(spec, args: tuple, kwargs: dict) -> float:
    if spec is None:
        return 0.0
    return float(spec(*args, **kwargs) if callable(spec) else spec)


def _dequeue(infeed, what: str):
    """The next infeed element of the calling replica."""
    take = getattr(infeed, "next_element", None)
    if take is not None:
        return take()
    return next(infeed)


class _Timing:
    """The modelled clock of one run: the pipeline's steps priced by
    :class:`~ipu_node.pipelining.pricing.PipelinePricer` as they run and laid on the IPUs'
    live timelines (a stage's FLOPs may depend on its inputs). Peak figures are looked up
    once per dtype."""

    def __init__(self, plan: PipelinePlan):
        system = get_system()
        self.efficiency = system.config.execution.compute_efficiency
        self.ids = sorted({ipu.id for ipu in plan.ipus})
        self.tl = {i: _clock.timeline(i) for i in self.ids}
        self.start_s = max(t.now_s for t in self.tl.values())
        self._sync(self.start_s)
        self.pricer = PipelinePricer(system.model, self.ids, start_s=self.start_s,
                                     keep_events=False)
        self.copy_s = self.pricer.copy_s
        self._rate: dict = {}   # (dtype, version) -> FLOP/s sustained

    def _sync(self, t_s: float) -> None:
        for t in self.tl.values():
            t.wait_until(t_s)

    @property
    def now_s(self) -> float:
        return max(t.now_s for t in self.tl.values())

    def compute_s(self, flops: float, dtype, version: str) -> float:
        """``flops / (peak(version, dtype) * efficiency)``, as
        :func:`ipu_node.clock.compute_time_s`."""
        if not flops:
            return 0.0
        rate = self._rate.get((dtype, version))
        if rate is None:
            rate = self._rate[(dtype, version)] = (
                _clock.peak_flops(version, dtype) * self.efficiency)
        if flops < 0:
            raise ValueError(f"a stage's flops must be >= 0, got {flops!r}")
        return flops / rate

    def step(self, passes: list) -> None:
        """``passes``: ``(ipu, compute_s, label, stage, m, copies)`` with copies
        ``[(dst or None, seconds)]``; lays the step out on the timelines: compute, then
        exchange (BSP, :meth:`~ipu_node.pipelining.pricing.PipelinePricer.step`)."""
        laid = self.pricer.step(passes, start_s=self.now_s)
        for ipu, evs in laid.events.items():
            self.tl[ipu].extend(evs)
        self._sync(laid.end_s)

    def weight_update(self, apply) -> dict[int, float]:
        """Runs ``apply()`` (its collectives charge the timelines); per IPU the seconds."""
        start = self.now_s
        self._sync(start)
        apply()
        spent = {i: t.now_s - start for i, t in self.tl.items()}
        self._sync(self.now_s)
        return spent


class _Run:
    """One call of ``pipeline``: the state of the repeat in flight."""

    def __init__(self, plan: PipelinePlan):
        self.plan = plan
        self.S = len(plan.stages)
        self.timing = _Timing(plan)
        self.memory = get_system().memory
        self.records: list[StepRecord] = []
        self.wu = WeightUpdate(plan)

    # -- passes ----------------------------------------------------------------------------

    def _stage0_inputs(self, m: int) -> tuple[tuple, dict, int]:
        args, kwargs = self.plan.inputs, {}
        infeed_bytes = 0
        if self.plan.infeed_queue is not None:
            element = _dequeue(self.plan.infeed_queue, self.plan.name)
            infeed_bytes = nbytes_of(element)
            e_args, kwargs = as_call(element)
            args = args + e_args
        return args, kwargs, infeed_bytes

    def forward(self, s: int, m: int):
        plan, stage = self.plan, self.plan.stages[s]
        copies = []
        if s == 0:
            args, kwargs, infeed_bytes = self._stage0_inputs(m)
            copies.append((None, self.timing.copy_s(plan.ipus[0].id, None, infeed_bytes)))
        else:
            args, kwargs = self.acts.pop((s, m))
        flops = _flops(getattr(stage, "flops", None), args, kwargs)
        dtype = _first_float_dtype((args, kwargs))
        if plan.training:
            outputs, saved = self._call_forward(s, stage, args, kwargs)
            bwd = getattr(stage, "backward_flops", None)
            bflops = _flops(bwd, args, kwargs) if bwd is not None else 2 * flops
            if plan.recompute:
                bflops += flops
                saved = (args, kwargs)
            self._stash(s, m, saved, bflops, dtype)
        else:
            outputs = (self._call_forward(s, stage, args, kwargs)[0]
                       if isinstance(stage, Stage) else stage(*args, **kwargs))
        ipu = plan.ipus[s].id
        if s < self.S - 1:
            self.acts[(s + 1, m)] = as_call(outputs)
            copies.append((plan.ipus[s + 1].id,
                           self.timing.copy_s(ipu, plan.ipus[s + 1].id, nbytes_of(outputs))))
        else:
            self.frame.iteration = self.repeat * plan.g + m
            out_bytes = self.wu.last_stage(m, outputs, self.out_grads)
            copies.append((None, self.timing.copy_s(ipu, None, out_bytes)))
        compute = self.timing.compute_s(flops, dtype, plan.ipus[s].version)
        return compute, copies

    def _call_forward(self, s: int, stage, args: tuple, kwargs: dict):
        result = stage.forward(*args, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(f"pipeline stage {s} ({stage!r}): forward must return "
                            f"(outputs, saved), got {type(result).__name__}")
        return result

    def _stash(self, s: int, m: int, saved, bflops: float, dtype) -> None:
        name = f"{self.plan.name}/stash/stage{s}/mb{m}"
        self.memory[self.plan.ipus[s].id].allocate(name, nbytes_of(saved), replace=True)
        self.saved[(s, m)] = (saved, bflops, dtype, name)

    def backward(self, s: int, m: int):
        plan, stage = self.plan, self.plan.stages[s]
        saved, bflops, dtype, name = self.saved.pop((s, m))
        ipu = plan.ipus[s]
        self.memory[ipu.id].free(name)
        if plan.recompute:
            args, kwargs = saved
            saved = self._call_forward(s, stage, args, kwargs)[1]
        result = stage.backward(saved, self.out_grads.pop((s, m)))
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], dict)):
            raise TypeError(f"pipeline stage {s} ({stage!r}): backward must return "
                            f"({{Variable: gradient}}, input_grads), got {result!r:.200}")
        grads, input_grads = result
        self.wu.accumulate(s, m, grads)
        copies = []
        if s > 0:
            self.out_grads[(s - 1, m)] = input_grads
            copies.append((plan.ipus[s - 1].id, self.timing.copy_s(
                ipu.id, plan.ipus[s - 1].id, nbytes_of(input_grads))))
        return self.timing.compute_s(bflops, dtype, ipu.version), copies

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        """The whole run inside a loop frame of its own (kind ``"pipeline"``, one iteration
        per micro-batch), so that every micro-batch may enqueue the outfeed once."""
        with loops.frame("pipeline", self.plan.repeat_count * self.plan.g) as frame:
            self.frame = frame
            try:
                self._run()
            finally:  # a stage that raised leaves no stash accounted on the IPUs
                for (s, _), (_, _, _, name) in getattr(self, "saved", {}).items():
                    self.memory[self.plan.ipus[s].id].free(name)

    def _run(self) -> None:
        plan = self.plan
        scheduler = PipelineScheduler(plan.schedule, self.S)
        self.steps = scheduler.steps(plan.g, plan.training)
        self.t = 0
        for repeat in range(plan.repeat_count):
            self.repeat = repeat
            self.acts: dict = {}
            self.saved: dict = {}
            self.out_grads: dict = {}
            self.wu.start_repeat()
            scheduler.run(plan.g, plan.training, self.forward, self.backward,
                          on_step=self._lay_step)
            spent = self.timing.weight_update(self.wu.finish_repeat)
            if plan.training:
                for ipu in self.timing.ids:
                    self.records.append(StepRecord(self.t, ipu, "WU", None, None, 0.0,
                                                   spent[ipu], repeat))
                self.t += 1

    def _lay_step(self, _: int, results: list) -> None:
        """A step's passes ran: record them and lay the step on the IPUs' clocks."""
        laid = []
        ipus = self.plan.ipus
        for p, (compute, copies) in results:
            ipu = ipus[p.stage].id
            laid.append((ipu, compute, f"{p.kind}{p.stage}", p.stage, p.micro_batch, copies))
            self.records.append(StepRecord(self.t, ipu, p.kind, p.stage, p.micro_batch,
                                           compute, sum(c for _, c in copies), self.repeat))
        self.timing.step(laid)
        self.t += 1


def run_pipeline(plan: PipelinePlan) -> PipelineReport:
    """Run ``plan`` now in this replica's thread; the report of the run."""
    wall0 = time.perf_counter()
    run = _Run(plan)
    run.run()
    timing = run.timing
    pricer = timing.pricer
    return PipelineReport(
        steps=run.records, total_s=timing.now_s - timing.start_s,
        compute_phase_s=pricer.compute_phase_s, bubble_fraction=pricer.bubble_fraction,
        stash_depth=stash_depths(run.steps, run.S), busy_s=dict(pricer.busy_s),
        ipus=[ipu.id for ipu in plan.ipus], schedule=plan.schedule.name,
        gradient_accumulation_count=plan.g, repeat_count=plan.repeat_count,
        training=plan.training, recompute=plan.recompute, options=plan.options,
        wall_s=time.perf_counter() - wall0)
