"""What a model keeps in each IPU's In-Processor-Memory, from the model itself (poptorch
reference §2.4 ``TensorLocations``; the counts of :mod:`poptorch.modelling._profile`).

Per IPU of a replica, the tensors of the stages it runs:

* **parameters** and **buffers** (each on the IPU of the stage that uses it first);
* **optimizer state** (the optimizer's slots per trainable parameter,
  :func:`poptorch.execution._device_optim.state_nbytes_per_param`) and **gradient accumulators**
  (``gradientAccumulation > 1``, in the optimizer's ``accum_type``);
* **activations**: in training, each stage keeps what one micro-batch's backward pass needs
  for as many micro-batches as the schedule has in flight there (its stash depth). Without
  recomputation that is the tensors autograd saves; with recomputation (PopTorch turns it on
  for a pipeline over more than one IPU, PopART's ``RecomputationType::Pipeline``; or
  ``_Popart.set("autoRecomputation", n)``) the stash holds the stage's inputs and its
  ``recomputationCheckpoint`` tensors, and one micro-batch's saved tensors between two
  checkpoints are rebuilt before its backward pass (the working set). The last stage runs
  forward and backward in one step and keeps its saved tensors, for that step only. An IPU
  runs one pass at a time, so the working sets of the stages it holds (what one backward
  pass recomputes, the last stage's saved tensors) share its memory: it holds the largest,
  not their sum (stages on one IPU, as a ``ShardedExecution`` of blocks on IPU 0 with
  recomputation: Graphcore's single-IPU ResNet-50, whose pipeline splits on one IPU are
  recomputation checkpoints). In inference: the largest operation's operands and result;
* **code and exchange buffers**: :data:`CODE_AND_EXCHANGE_FRACTION` of the IPU's memory
  (ipupod assumption, below).

``TensorLocations`` move what they name: a location with ``useOnChipStorage(False)`` puts
those tensors in Streaming Memory (tensors with fewer than ``minElementsForOffChip`` elements
stay), ``useReplicatedTensorSharding(True)`` divides them over the job's replicas (those with
at least ``minElementsForReplicatedTensorSharding`` elements). The transfers they cause are
priced by :mod:`poptorch.modelling._modelled`.
"""

from __future__ import annotations

import torch
from collectives.performance.memory_plan import (CODE_AND_EXCHANGE_FRACTION, KINDS,
                                                 MemoryEntry, MemoryPlan)

__all__ = ["CODE_AND_EXCHANGE_FRACTION", "MemoryEntry", "MemoryPlan", "Locations",
           "plan_memory", "KINDS"]


class Locations:
    """``opts.TensorLocations`` as the memory and time models read it."""

    def __init__(self, values: dict, global_replicas: int):
        self._values = values
        self.replicas = global_replicas

    def _get(self, what: str) -> dict:
        return self._values.get(f"location_{what}", {}) or {}

    def off_chip(self, what: str, numel: int) -> bool:
        """Whether a ``what`` tensor (activation, weight, optimizer, accumulator) of
        ``numel`` elements lives in Streaming Memory."""
        loc = self._get(what)
        return loc.get("onChip", 1) == 0 and numel >= loc.get("minElementsForOffChip", 0)

    def shards(self, what: str, numel: int) -> int:
        """Over how many replicas a ``what`` tensor is sharded (1: not sharded)."""
        loc = self._get(what)
        if loc.get("useReplicatedTensorSharding", 0) and self.replicas > 1 and \
                numel >= loc.get("minElementsForReplicatedTensorSharding", 0):
            return self.replicas
        return 1

    def describe(self) -> dict:
        return {k: dict(v) for k, v in self._values.items() if k.startswith("location_")}


def plan_memory(name: str, profile, stage_ipus: tuple[int, ...], depths: list[int],
                training: bool, recompute: bool, params: dict, slots: dict[str, float],
                accumulator_size: int, G: int, locations: Locations,
                capacity: dict[int, int]) -> MemoryPlan:
    """The memory of one replica of model ``name`` (module docstring).

    Args:
        profile: the model's :class:`~poptorch.modelling._profile.ModelProfile`.
        stage_ipus: the replica IPU index of each stage.
        depths: each stage's stash depth (the schedule's; 1 when sharded, 0 in inference).
        params: parameter or buffer name -> tensor (replica 0's).
        slots: optimizer state bytes per element, by slot name (training).
        accumulator_size: bytes per element of a gradient accumulator.
        capacity: IPU index -> bytes of its memory.
    """
    plan = MemoryPlan({i: [] for i in sorted(set(stage_ipus))}, recompute and training)
    seen: set[str] = set()
    working_sets: dict[int, list[MemoryEntry]] = {}  # IPU -> one pass's working sets
    for s, (stage, ipu) in enumerate(zip(profile.stages, stage_ipus)):
        out = plan.entries[ipu]
        for pname in stage.params:
            if pname in seen:
                continue
            seen.add(pname)
            t = params[pname]
            if not isinstance(t, torch.nn.Parameter):
                out.append(MemoryEntry(f"{name}/buffer/{pname}", t.nbytes, "buffers"))
                continue
            numel = t.numel()
            w_off = locations.off_chip("weight", numel)
            w_shards = locations.shards("weight", numel)
            out.append(MemoryEntry(f"{name}/param/{pname}", -(-t.nbytes // w_shards),
                                   "parameters", w_off))
            if not (training and t.requires_grad):
                continue
            o_off = locations.off_chip("optimizer", numel)
            o_shards = locations.shards("optimizer", numel)
            for slot, size in slots.items():
                out.append(MemoryEntry(f"{name}/optimizer/{slot}/{pname}",
                                       -(-int(numel * size) // o_shards), "optimizer_state",
                                       o_off))
            if G > 1:
                out.append(MemoryEntry(f"{name}/accumulator/{pname}", numel * accumulator_size,
                                       "accumulators",
                                       locations.off_chip("accumulator", numel)))
        kept, working = _activations(name, s, stage, depths[s], training, recompute,
                                     s == len(profile.stages) - 1, locations)
        out.extend(kept)
        if working is not None:
            working_sets.setdefault(ipu, []).append(working)
    for ipu, sets in working_sets.items():
        plan.entries[ipu].append(_largest(sets))
    for ipu, out in plan.entries.items():
        out.append(MemoryEntry(f"{name}/code+exchange (ipupod assumption)",
                               int(capacity[ipu] * CODE_AND_EXCHANGE_FRACTION),
                               "code_and_exchange"))
    plan.assumptions = (
        f"code, vertex state and exchange buffers: {CODE_AND_EXCHANGE_FRACTION:.0%} of each "
        "IPU's memory (ipupod assumption)",
        ("activations of training: " + (
            "stage inputs and checkpoints x stash depth, plus one micro-batch's saved "
            "tensors between checkpoints (recomputation)" if plan.recompute else
            "the tensors autograd saves x stash depth")) if training else
        "activations of inference: the largest operation's operands and result per stage",
    )
    return plan


def _activations(name: str, s: int, stage, depth: int, training: bool, recompute: bool,
                 last: bool, locations: Locations) -> tuple[list[MemoryEntry], MemoryEntry | None]:
    """The activation entries of stage ``s``: those kept across passes, and the working set
    that lives only while one of its passes runs (None: none): the tensors recomputed
    between checkpoints before its backward pass, or, for the last stage, whose forward and
    backward passes run back to back on one micro-batch, its saved tensors."""
    prefix = f"{name}/activations/stage{s}"
    if not training:
        return [MemoryEntry(f"{prefix}/working", stage.peak_op_bytes, "activations")], None
    if recompute and not last:
        stash = stage.input_bytes + stage.checkpoint_bytes
        working = MemoryEntry(f"{prefix}/recomputed", stage.piece_saved_bytes, "activations")
    elif last and depth == 1:
        return [], MemoryEntry(f"{prefix}/stash x1", stage.saved_bytes, "activations")
    else:
        stash, working = stage.saved_bytes, None
    # the stash moves as one tensor group (its elements counted at 4 bytes)
    off = locations.off_chip("activation", max(1, stash // 4)) and not last
    out = [MemoryEntry(f"{prefix}/stash x{depth}", depth * stash, "activations", off)]
    if off:  # the micro-batch in use comes back on chip
        out.append(MemoryEntry(f"{prefix}/stash in use", stash, "activations"))
    return out, working if working is not None and working.nbytes else None


def _largest(sets: list[MemoryEntry]) -> MemoryEntry:
    """One IPU's working sets of single passes: an IPU runs one pass at a time, so they
    share memory and the IPU holds the largest (named with the stages that share it)."""
    big = max(sets, key=lambda e: e.nbytes)
    if len(sets) == 1:
        return big
    stages = ", ".join(e.name.split("/")[-2] for e in sets)
    return MemoryEntry(f"{big.name} (the largest working set of {stages}: one pass at a "
                       "time)", big.nbytes, "activations")
