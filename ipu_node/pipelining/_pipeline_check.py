"""The argument rules of :func:`ipu_node.pipelining_ops.pipeline`, with TF-IPU's messages
(reference execution-model.md §1.3 and §1.9; PO = ``pipelining_ops.py`` at SDK 2.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ipu_node.errors import FailedPreconditionError, WiderReplicasNeeded
from ipu_node.pipelining.schedules import PipelineSchedule, overlap_length
from ipu_node.pipelining._pipeline_types import PipelineStageOptions, RecomputationMode, Stage
from ipu_node.runtime.device import IPU

__all__ = ["PipelinePlan", "check_pipeline"]

_INT32_MAX = 2**31 - 1
_RECORDED = ("forward_propagation_stages_poplar_options",
             "backward_propagation_stages_poplar_options", "weight_update_poplar_options",
             "offload_weight_update_variables", "replicated_optimizer_state_sharding",
             "offload_activations", "offload_gradient_accumulation_buffers",
             "replicated_weight_sharding", "offload_weights", "batch_serialization_iterations",
             "recomputation_mode")


@dataclass
class PipelinePlan:
    """A checked pipeline call: what the runtime needs."""

    stages: list
    g: int
    repeat_count: int
    inputs: tuple
    infeed_queue: Any
    outfeed_queue: Any
    optimizer_function: Callable | None
    ipus: list[IPU]            # the IPU of each stage
    schedule: PipelineSchedule
    recompute: bool
    outfeed_loss: bool
    accumulate_outfeed: bool
    accumulate_outfeed_dtype: Any
    outfeed_mask: list[bool] | None
    reduction_method: str
    accumulation_dtype: Any
    local_index: int
    name: str
    options: dict

    @property
    def training(self) -> bool:
        return self.optimizer_function is not None


def _check_g(g: Any) -> int:
    """PO:639-646."""
    if g is None:
        raise ValueError("gradient_accumulation_count must be specified.")
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
        raise TypeError(f"gradient_accumulation_count must be an int, not {type(g).__name__}")
    if g < 0:
        raise ValueError("gradient_accumulation_count must be >= 0.")
    if g > _INT32_MAX:
        raise ValueError("gradient_accumulation_count must be < max int32.")
    return int(g)


def _check_enum(value: Any, enum_type, what: str, default):
    """PO:673-687."""
    if value is None:
        return default
    if not isinstance(value, enum_type):
        raise TypeError(f"The given {what} is not a member of the {enum_type.__name__} "
                        "enumeration.")
    return value


def _check_mapping(mapping: Any, num_stages: int, ipr: int, bsi: int) -> list[int]:
    """PO:688-716, and ipupod's range rule (reference §4: a shard of the replica), with the
    replication factor derived from the shards while the layout allows it (:func:`_shards`)."""
    if mapping is None:
        mapping = [0] * num_stages if bsi > 1 else list(range(num_stages))
        _shards(max(mapping) + 1, ipr, "the default device_mapping (stage i on IPU i)")
        return mapping
    if not isinstance(mapping, (list, tuple)):
        raise TypeError("device_mapping argument needs to be a list or a tuple.")
    if len(mapping) != num_stages:
        raise ValueError(f"Each stage must be mapped to an IPU: {len(mapping)} mappings != "
                         f"{num_stages} stages")
    for i, shard in enumerate(mapping):
        if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)) or shard < 0:
            raise ValueError(
                f"device_mapping[{i}] (stage {i}) is {shard!r}, not an IPU of the replica: "
                f"each replica has {ipr} IPUs (ipus_per_replica), so a stage maps to "
                f"0..{ipr - 1}")
    needed = int(max(mapping)) + 1
    first = next(i for i, shard in enumerate(mapping) if shard == needed - 1)
    _shards(needed, ipr, f"device_mapping={list(mapping)!r}",
            f"device_mapping[{first}] (stage {first}) is {needed - 1}, not an IPU of the "
            f"replica: each replica has {ipr} IPUs (ipus_per_replica), so a stage maps to "
            f"0..{ipr - 1}")
    return [int(s) for s in mapping]


def _shards(needed: int, ipr: int, what: str, message: str | None = None) -> None:
    """A pipeline whose stages need ``needed`` IPUs per replica, on replicas of ``ipr``:
    TF-IPU derives the replication factor from the graph's shards (the device's IPUs over
    them). While the configured system's layout is derived and unbound, ask the runner to
    widen the replicas (:class:`WiderReplicasNeeded`); otherwise say what to set."""
    from ipu_node.runtime.system import get_system

    if needed <= ipr:
        return
    system = get_system()
    if system.can_widen(needed):
        raise WiderReplicasNeeded(
            f"the pipeline needs {needed} IPUs per replica ({what}) and the replicas have "
            f"{ipr}: the replication factor is derived from the pipeline's shards, so "
            f"strategy.run widens the replicas to {needed} IPUs and runs again (call the "
            "pipeline through strategy.run or ipu_compiler.compile under a strategy, or set "
            f"IPUConfig.ipus_per_replica = {needed})", needed)
    device = len(system.devices[0].ipus)
    why = (f"set IPUConfig.ipus_per_replica = {needed} before configuring (the layout was "
           f"bound by {system.layout_bound_by})" if device % needed == 0 and
           system.layout_bound_by else
           f"/device:IPU:0 has {device} IPUs, which {needed}-IPU replicas do not divide")
    raise ValueError(f"{message or f'the pipeline needs {needed} IPUs per replica ({what}) '}"
                     f"{'' if message else f'but each replica has {ipr} (ipus_per_replica)'}"
                     f": {why}")


def _check_outfeed_options(kw: dict) -> None:
    """PO:800-819."""
    training = kw["optimizer_function"] is not None
    if kw["outfeed_mask"] is not None and not training:
        raise ValueError("An optimizer_function must be provided when outfeed_mask is set.")
    if kw["outfeed_loss"] and not training:
        raise ValueError("An optimizer_function must be provided when outfeed_loss is True.")
    if kw["outfeed_loss"] and kw["outfeed_mask"] is not None:
        raise ValueError("Only one of `outfeed_loss` and `outfeed_mask` can be set.")
    if kw["outfeed_loss"] and kw["outfeed_queue"] is None:
        raise ValueError("An outfeed_queue must be provided when outfeed_loss is True")
    if kw["accumulate_outfeed"]:
        if kw["outfeed_queue"] is None:
            raise ValueError("An outfeed_queue must be provided when accumulate_outfeed is "
                             "True.")
        mode = getattr(kw["outfeed_queue"], "outfeed_mode", None)
        if getattr(mode, "value", mode) not in (None, "all"):
            raise ValueError("To accumulate the outfeed, it must be in IPUOutfeedMode ALL.")


def _check_stages(stages: Any, training: bool) -> list:
    if not isinstance(stages, (list, tuple)) or len(stages) < 2:
        raise ValueError("Pipeline requires at least two computational stages.")
    for i, stage in enumerate(stages):
        if not (isinstance(stage, Stage) or callable(stage)):
            raise TypeError(f"computational_stages[{i}] must be a Stage or a callable, not "
                            f"{type(stage).__name__}")
        if training and not (isinstance(stage, Stage) and stage.backward is not None):
            raise ValueError(
                f"computational_stages[{i}] has no backward function, but the pipeline "
                "trains (optimizer_function is set): give it as Stage(forward, backward)")
    return list(stages)


def _check_stage_options(kw: dict, num_stages: int) -> None:
    """The ``*_poplar_options`` arguments (seed 004:4007 parameters): a list of one
    :class:`PipelineStageOptions` per stage, or one for the weight update."""
    for what in ("forward_propagation_stages_poplar_options",
                 "backward_propagation_stages_poplar_options"):
        value = kw[what]
        if value is None:
            continue
        if not isinstance(value, (list, tuple)) or len(value) != num_stages or not all(
                isinstance(o, PipelineStageOptions) for o in value):
            raise ValueError(f"{what} must be a list of {num_stages} PipelineStageOptions "
                             f"(one per computational stage), got {value!r:.200}")
    wu = kw["weight_update_poplar_options"]
    if wu is not None and not isinstance(wu, PipelineStageOptions):
        raise TypeError("weight_update_poplar_options must be a PipelineStageOptions, not "
                        f"{type(wu).__name__}")


def _check_reduction(value: Any) -> str:
    value = getattr(value, "value", value)
    if value not in ("SUM", "MEAN", "RUNNING_MEAN"):
        raise ValueError(f"reduction_method must be SUM, MEAN or RUNNING_MEAN, got {value!r}")
    return value


def _check_overlap(schedule: PipelineSchedule, num_stages: int, training: bool,
                   g: int) -> None:
    """The compile-time check of PV:593-615 (HEAD pipeline_visitor.cc)."""
    length = overlap_length(schedule, num_stages, training)
    tail = (" This number might be called gradient_accumulation_count, "
            "gradient_accumulation_steps_per_replica or steps_per_execution depending on "
            "the API used.")
    if g % length:
        raise FailedPreconditionError(
            f"The number of iterations of the pipeline must be a multiple of {length}, but "
            f"it is {g}." + tail)
    if g < length:
        raise FailedPreconditionError(
            f"The number of iterations of the pipeline must be at least {length}, but it is "
            f"{g}." + tail)


def check_pipeline(kw: dict) -> PipelinePlan:
    """Validate the arguments of ``pipeline`` (its ``locals()``) in TF-IPU's order."""
    from ipu_node.runtime.replica import require_replica_context
    from ipu_node.runtime.system import get_system

    g = _check_g(kw["gradient_accumulation_count"])
    if kw["continuous_weight_updates"]:
        raise NotImplementedError("Continuous weight updates are currently not supported.")
    bsi = kw["batch_serialization_iterations"]
    if isinstance(bsi, bool) or not isinstance(bsi, int) or bsi < 1:
        raise ValueError(f"batch_serialization_iterations must be an int >= 1, got {bsi!r}")
    schedule = _check_enum(kw["pipeline_schedule"], PipelineSchedule, "pipeline_schedule",
                           PipelineSchedule.Sequential if bsi > 1 else PipelineSchedule.Grouped)
    if bsi > 1 and schedule is not PipelineSchedule.Sequential:
        raise NotImplementedError(
            "Batch serialization is only supported with the `Sequential` schedule.")
    mode = _check_enum(kw["recomputation_mode"], RecomputationMode, "recomputation_mode",
                       RecomputationMode.Auto)
    repeat = kw["repeat_count"]
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat_count must be an int >= 1, got {repeat!r}")
    training = kw["optimizer_function"] is not None
    stages = _check_stages(kw["computational_stages"], training)
    ctx = require_replica_context("pipelining_ops.pipeline")
    mapping = _check_mapping(kw["device_mapping"], len(stages), len(ctx.ipus), bsi)
    if (schedule is PipelineSchedule.Interleaved and training
            and len(set(mapping)) != len(mapping)):
        raise NotImplementedError(
            "The pipelining schedule 'Interleaved' does not currently support multiple "
            "pipeline stages on the same device for training graphs. Please use a different "
            "pipeline schedule.")
    _check_outfeed_options(kw)
    _check_stage_options(kw, len(stages))
    mask = kw["outfeed_mask"]
    if mask is not None:
        if not isinstance(mask, (list, tuple)) or not all(isinstance(m, bool) for m in mask):
            raise TypeError("outfeed_mask must be a list of bools (True drops an output)")
        mask = list(mask)
    _check_overlap(schedule, len(stages), training, g)
    inputs = kw["inputs"]
    if inputs is not None and not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a list or a tuple, not {type(inputs).__name__}")
    options = {k: kw[k] for k in _RECORDED}
    options["recomputation_mode"] = mode.name
    return PipelinePlan(
        stages=stages, g=g, repeat_count=repeat, inputs=tuple(inputs or ()),
        infeed_queue=kw["infeed_queue"], outfeed_queue=kw["outfeed_queue"],
        optimizer_function=kw["optimizer_function"],
        ipus=[ctx.ipus[s] for s in mapping], schedule=schedule,
        recompute=training and get_system().config.allow_recompute,
        outfeed_loss=bool(kw["outfeed_loss"]), accumulate_outfeed=bool(kw["accumulate_outfeed"]),
        accumulate_outfeed_dtype=kw["accumulate_outfeed_dtype"], outfeed_mask=mask,
        reduction_method=_check_reduction(kw["reduction_method"]),
        accumulation_dtype=kw["gradient_accumulation_dtype"], local_index=ctx.local_index,
        name=kw["name"] or "pipeline", options=options)
