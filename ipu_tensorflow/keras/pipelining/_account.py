"""The account of a pipelined Keras model (issue 32 items 3 and 6): what each stage's IPU
holds beyond what ipu_node's pipeline runtime counts as it runs, and the model's entry in the
run report, as :mod:`ipu_tensorflow._keras_memory` gives them for an unpipelined model.

ipu_node's pipeline runtime already counts, on each stage's IPU, the stage's weights (the
``ipu_node.Variable`` standing for each ``tf.Variable``) and its stashed activations while
they live. At compile (the first ``fit`` after ``compile``), before any step,
:func:`place_state` adds on the IPU of the stage that owns each trainable variable:

* **optimizer state**: the model optimizer's slots of that variable (Adam's ``m`` and ``v``,
  momentum, ...; built now, in the strategy's scope, as the first ``apply_gradients`` would:
  the same variables ``model.optimizer.get_weights()`` and checkpoints return); the
  optimizer's other variables (its iteration counter) on stage 0's IPU;
* **gradient accumulators** when G > 1: one float32 tensor per trainable variable;
* **code and exchange buffers**: the share of each IPU's memory of
  :data:`~collectives.performance.memory_plan.CODE_AND_EXCHANGE_FRACTION` (ipupod
  assumption, there).

A model that does not fit raises ``ipu_node.IPUOutOfMemoryError`` (the IPU, bytes needed and
available, the largest tensors) before its first step. After its first training window,
:func:`record_report` keeps the facts of its
:class:`~collectives.performance.model_report.ModelReport` (stages with their IPUs, FLOPs,
stash depth and bytes; memory per IPU; the modelled step from the runtime's report) and
registers the model in the run report's ``tensorflow`` section.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from collectives.performance.memory_plan import (CODE_AND_EXCHANGE_FRACTION, MemoryEntry,
                                                 MemoryPlan)
from collectives.performance.model_report import StageReport
from ipu_node import clock, get_system

from ipu_tensorflow import _keras_memory

__all__ = ["slots_by_variable", "place_state", "record_report", "element_nbytes"]


def _nbytes(v) -> int:
    return int(np.prod(v.shape.as_list())) * v.dtype.size


def slots_by_variable(optimizer, variables: list) -> tuple[dict, list]:
    """``({variable.ref(): [its slot variables]}, [the optimizer's other variables])`` of a
    built tf-keras optimizer: a legacy ``OptimizerV2``'s ``get_slot``; a new optimizer's
    variables named ``<slot>/<variable's shared name>`` (tf-keras ``add_variable_from_
    reference``)."""
    found = optimizer.variables
    own = list(found() if callable(found) else found)
    by_var: dict = {v.ref(): [] for v in variables}
    if callable(getattr(optimizer, "get_slot_names", None)) and \
            callable(getattr(optimizer, "get_slot", None)):
        for v in variables:
            for name in optimizer.get_slot_names():
                try:
                    by_var[v.ref()].append(optimizer.get_slot(v, name))
                except KeyError:
                    pass
    else:
        shared = {getattr(v, "_shared_name", v.name.split(":")[0]): v for v in variables}
        for ov in own:
            name = getattr(ov, "_shared_name", ov.name.split(":")[0])
            owner = shared.get(name.partition("/")[2])
            if owner is not None and tuple(ov.shape) == tuple(owner.shape):
                by_var[owner.ref()].append(ov)
    slotted = {s.ref() for slots in by_var.values() for s in slots}
    return by_var, [ov for ov in own if ov.ref() not in slotted]


def _stage_plan(model, strategy, G: int, capacity: int) -> MemoryPlan:
    """Per shard of the replica (``device_mapping``): the entries of the module docstring."""
    cut = model._pipeline_cut()
    mapping = model._pipeline_device_mapping()
    name = model.name
    _keras_memory.optimizer_variables(model, strategy)         # (built now, in scope)
    slots, others = slots_by_variable(model.optimizer, model.trainable_variables)
    entries: dict[int, list] = {}
    for shard in sorted(set(mapping)):
        entries[shard] = [MemoryEntry(f"{name}/code+exchange (ipupod assumption)",
                                      int(capacity * CODE_AND_EXCHANGE_FRACTION),
                                      "code_and_exchange")]
    for s in range(cut.num_stages):
        shard = entries[mapping[s]]
        for var in cut.stage_variables(s):
            shard += [MemoryEntry(f"{name}/optimizer/{slot.name}", _nbytes(slot),
                                  "optimizer_state") for slot in slots[var.ref()]]
            if G > 1:
                shard.append(MemoryEntry(f"{name}/accumulator/{var.name}",
                                         int(np.prod(var.shape.as_list())) * 4, "accumulators"))
    entries[mapping[0]] += [MemoryEntry(f"{name}/optimizer/{v.name}", _nbytes(v),
                                        "optimizer_state") for v in others]
    return MemoryPlan(entries, False, (
        f"code, vertex state and exchange buffers: {CODE_AND_EXCHANGE_FRACTION:.0%} of each "
        "IPU's memory (ipupod assumption)",
        "weights and stashed activations: counted by the pipeline runtime as it runs; the "
        "stash of a stage is its inputs and its layers' outputs for each micro-batch in "
        "flight (the schedule's stash depth)"))


def place_state(model, strategy, G: int) -> MemoryPlan:
    """Place the optimizer state, accumulators and code of ``model``'s stages on every local
    replica's IPUs (module docstring); returns the plan.

    Raises:
        ipu_node.IPUOutOfMemoryError: an IPU's SRAM would be exceeded; nothing is left placed.
    """
    system = get_system()
    ipu = system.replica_context(0).ipus[0]
    memory_plan = _stage_plan(model, strategy, G, system.memory[ipu.id].capacity_bytes)
    _keras_memory.place(memory_plan, f"{model.name}/")
    model.__dict__["_ipu_fns"]["pipeline_plan"] = memory_plan
    return memory_plan


def _stage_reports(run, report, mapping: list, version: str, input_bytes: int) -> list:
    out = []
    for s in range(run.cut.num_stages):
        forward = float(run.stage_flops(s))
        backward = 2.0 * forward     # (the pipeline runtime's assumption, ipu_node Stage)
        out.append(StageReport(
            s, mapping[s], tuple(node.layer.name for node in run.cut.stages[s]), forward,
            backward, forward if report.recompute else 0.0, run.saved_bytes.get(s, 0),
            input_bytes if s == 0 else run.input_bytes.get(s, 0), report.stash_depth[s],
            clock.compute_time_s(forward, np.float32, version),
            clock.compute_time_s(backward, np.float32, version)))
    return out


def record_report(model, run, report, batch: int, input_bytes: int, G: int, spe: int) -> None:
    """Keep the facts of ``model``'s report after its first training window (``run``: its
    ``PipelineRun``; ``report``: the runtime's report of local replica 0's window;
    ``input_bytes``: one micro-batch's) and register it in the run report."""
    system = get_system()
    ipus = system.replica_context(0).ipus
    mapping = model._pipeline_device_mapping()
    memory_plan = model.__dict__["_ipu_fns"]["pipeline_plan"]
    stages = _stage_reports(run, report, mapping, ipus[0].version, input_bytes)
    memory = {}
    for shard in sorted(memory_plan.entries):
        kinds = dict(memory_plan.breakdown(shard))
        on = [s for s in range(len(stages)) if mapping[s] == shard]
        kinds["parameters"] = kinds.get("parameters", 0) + sum(
            _nbytes(v) for s in on for v in run.cut.stage_variables(s))
        kinds["activations"] = kinds.get("activations", 0) + sum(
            stages[s].stash_depth * stages[s].saved_bytes for s in on)
        memory[ipus[shard].id] = {**kinds,
                                  "capacity": system.memory[ipus[shard].id].capacity_bytes}
    wu_s = max((r.copy_s for r in report.steps if r.kind == "WU"), default=0.0)
    total = report.total_s / report.repeat_count
    params = int(sum(np.prod(v.shape.as_list()) for v in model.trainable_variables))
    flops = [st.forward_flops + st.backward_flops for st in stages]
    optimizer_bytes = sum(k.get("optimizer_state", 0) for k in memory.values())
    model.__dict__["_ipu_fns"]["model_facts"] = dict(
        name=model.name, training=True, schedule=report.schedule, stages=stages,
        micro_batch=batch, gradient_accumulation=G, device_iterations=spe,
        replicas=system.num_local_replicas, global_replicas=system.num_replicas,
        ipus_per_replica=len(ipus), recompute=report.recompute, memory=memory,
        planned_step_s=total / G, pipeline_s=(total - wu_s) / G, weight_update_s=wu_s / G,
        bubble_fraction=report.bubble_fraction, assumptions=memory_plan.assumptions,
        card=dict(params=params, flops_per_item=sum(flops) / batch,
                  stage_shares=[f / sum(flops) if sum(flops) else 1.0 / len(flops)
                                for f in flops],
                  grad_dtype="float32", input_bytes_per_item=input_bytes // batch,
                  optimizer_state_bytes_per_param=optimizer_bytes / params if params else 0.0,
                  optimizer_state_in="sram"),
        steps_run=[0], clock_start_s=_keras_memory.clock_now() - report.total_s)
    _keras_memory.register(model)


def element_nbytes(element) -> int:
    """Bytes of one micro-batch ``(x, y, sample_weight)`` as fed from the host."""
    return int(sum(np.asarray(t).nbytes for t in tf.nest.flatten(element) if t is not None))
