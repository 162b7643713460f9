"""What a Keras model keeps in each IPU's In-Processor-Memory, and ipupod's account of it
(issue 32 item 6): the TF front end's half of what :mod:`poptorch.modelling._memory` and
:mod:`poptorch.modelling._model_report` are to PopTorch, on the same
:class:`~collectives.performance.memory_plan.MemoryPlan` and
:class:`~collectives.performance.model_report.ModelReport`.

At compile (the first ``fit`` of a model: its training step traced), every local replica's IPU
gets, in ipu_node's SRAM accounting (:class:`ipu_node.IPUMemory` of the configured system):

* **code and exchange buffers**: :data:`~collectives.performance.memory_plan.
  CODE_AND_EXCHANGE_FRACTION` of the IPU's memory (ipupod assumption, there);
* **parameters** (trainable variables) and **buffers** (non-trainable variables), their bytes;
* **optimizer state**: the optimizer's variables (its slots, e.g. Adam's ``m`` and ``v``, and
  its iteration counter), built for the model's trainable variables as its first
  ``apply_gradients`` would;
* **gradient accumulators** (gradient accumulation over G > 1 micro-batches): one float32
  tensor per trainable variable;
* **activations**: the tensors of the traced training step's forward part that its backward
  part reads (the ops TensorFlow's ``GradientTape`` puts under ``gradient_tape/``), the input
  batch included and the variables' reads excluded: one micro-batch in flight (stash depth 1).

A model that does not fit raises :class:`ipu_node.IPUOutOfMemoryError` (the IPU, the bytes
needed and available, the largest tensors on it) before its first step, and leaves nothing
placed. Pipelined models (``PipelineStage``, ``set_pipeline_stage_assignment``) are not planned
here: ipu_node's pipeline runtime counts their stages' weights (as ``ipu_node.Variable``) and
stashes on each stage's IPU as they run, with the same error, and
:mod:`ipu_tensorflow.keras.pipelining._account` places their optimizer state and
accumulators on each stage's IPU and keeps their :class:`ModelReport` (in the same
section).

The account (:func:`model_report`) goes into the run report's ``tensorflow`` section
(:func:`collectives.performance.run_report.add_report_section`) with each model's stages,
memory and modelled step, and its card fields into the report's step estimate
(:func:`offer_card`; ``ModelCard.from_run(run=model.modelReport())``).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import tensorflow as tf
from collectives.performance.memory_plan import (CODE_AND_EXCHANGE_FRACTION, MemoryEntry,
                                                 MemoryPlan)
from collectives.performance.model_report import ModelReport, StageReport
from ipu_node import clock, get_system, host_transfer_time_s

__all__ = ["saved_activation_bytes", "plan", "place", "compile_facts", "count_steps",
           "model_report", "register", "offer_card", "report_section", "optimizer_variables",
           "clock_now"]

#: the name scope of the ops TensorFlow's GradientTape adds for the backward pass
_BACKWARD_SCOPE = "gradient_tape/"
#: ops whose outputs are not activations (variables' reads, constants, handles)
_NOT_ACTIVATIONS = frozenset({"ReadVariableOp", "Const", "VarHandleOp",
                              "ResourceGather", "Identity"})

_models: list[weakref.ref] = []
_lock = threading.Lock()
_registered = {"done": False}


def _tensor_nbytes(t) -> int:
    return int(np.prod(t.shape.as_list())) * t.dtype.size


def saved_activation_bytes(concrete) -> tuple[int, int]:
    """``(saved bytes, input bytes)`` of one call of a traced training step ``concrete``
    (a ``ConcreteFunction`` with static shapes): the forward tensors its backward ops read,
    each counted once, and of those the ones fed from outside (the batch)."""
    saved: dict[str, int] = {}
    inputs = 0
    for op in concrete.graph.get_operations():
        if not op.name.startswith(_BACKWARD_SCOPE):
            continue
        for t in op.inputs:
            source = t.op
            if source.name.startswith(_BACKWARD_SCOPE) or source.type in _NOT_ACTIVATIONS or \
                    t.name in saved or not (t.dtype.is_floating or t.dtype.is_integer) or \
                    not t.shape.is_fully_defined():
                continue
            saved[t.name] = _tensor_nbytes(t)
            if source.type == "Placeholder":
                inputs += saved[t.name]
    return sum(saved.values()), inputs


def optimizer_variables(model, strategy) -> list:
    """The optimizer's variables for the model's trainable variables (built now, in the
    strategy's scope, when the first ``apply_gradients`` has not built them yet)."""
    opt = model.optimizer
    if opt is None:
        return []
    if not getattr(opt, "_built", False) and hasattr(opt, "build"):
        with strategy.scope():
            opt.build(model.trainable_variables)
    elif hasattr(opt, "_create_all_weights"):      # a legacy OptimizerV2: its slots now
        with strategy.scope():
            opt._create_all_weights(model.trainable_variables)
    variables = opt.variables
    return list(variables() if callable(variables) else variables)


def plan(model, strategy, concrete, G: int, capacity: int) -> MemoryPlan:
    """The memory of one replica of ``model`` on its one IPU (index 0; module docstring).

    Args:
        concrete: the traced training step of one micro-batch.
        G: gradient accumulation steps per replica.
        capacity: bytes of the IPU's memory.
    """
    name = model.name
    out = [MemoryEntry(f"{name}/code+exchange (ipupod assumption)",
                       int(capacity * CODE_AND_EXCHANGE_FRACTION), "code_and_exchange")]
    out += [MemoryEntry(f"{name}/param/{v.name}", _tensor_nbytes(v), "parameters")
            for v in model.trainable_variables]
    out += [MemoryEntry(f"{name}/buffer/{v.name}", _tensor_nbytes(v), "buffers")
            for v in model.non_trainable_variables]
    out += [MemoryEntry(f"{name}/optimizer/{v.name}", _tensor_nbytes(v), "optimizer_state")
            for v in optimizer_variables(model, strategy)]
    if G > 1:
        out += [MemoryEntry(f"{name}/accumulator/{v.name}",
                            int(np.prod(v.shape.as_list())) * 4, "accumulators")
                for v in model.trainable_variables]
    saved, _ = saved_activation_bytes(concrete)
    out.append(MemoryEntry(f"{name}/activations/stage0/stash x1", saved, "activations"))
    return MemoryPlan({0: out}, False, (
        f"code, vertex state and exchange buffers: {CODE_AND_EXCHANGE_FRACTION:.0%} of each "
        "IPU's memory (ipupod assumption)",
        "activations of training: the forward tensors the traced step's backward pass reads "
        "(GradientTape), one micro-batch in flight"))


def place(memory_plan: MemoryPlan, prefix: str) -> dict[int, int]:
    """Count ``memory_plan``'s on-chip entries of IPU index i on every local replica's i-th
    IPU in the configured system's SRAM accounting, in place of the tensors there whose
    names start with ``prefix`` (the model's last plan: its entries' names start with
    ``<model name>/``; two models of one name share them). Returns the capacity of each IPU
    used, by IPU id.

    Raises:
        ipu_node.IPUOutOfMemoryError: an IPU's SRAM would be exceeded (the IPU, bytes needed
            and available, its largest tensors); what this call placed is freed again.
    """
    system = get_system()
    placed = []
    capacity = {}
    try:
        for r in range(system.num_local_replicas):
            for shard in sorted(memory_plan.entries):
                ipu = system.replica_context(r).ipus[shard]
                memory = system.memory[ipu.id]
                capacity[ipu.id] = memory.capacity_bytes
                for tensor in memory.tensors():   # (a model compiled again: its last plan)
                    if tensor.startswith(prefix):
                        memory.free(tensor)
                for entry in memory_plan.on_chip(shard):
                    memory.allocate(entry.name, entry.nbytes, replace=True)
                    placed.append((memory, entry.name))
    except BaseException:
        for memory, tensor in placed:
            try:
                memory.free(tensor)
            except KeyError:
                pass
        raise
    return capacity


def model_report(model) -> ModelReport | None:
    """ipupod's account of ``model`` after its first ``fit`` (module docstring), or None
    before. The modelled step: how far the IPU timelines advanced since its compile over the
    steps run (one step: one micro-batch of every replica; another model trained in between
    counts in it)."""
    facts = model.__dict__.get("_ipu_fns", {}).get("model_facts")
    if facts is None:
        return None
    f = dict(facts)
    steps = f.pop("steps_run")[0]
    modelled = clock_now() - f.pop("clock_start_s")
    return ModelReport(**f, steps=steps, modelled_s=modelled if steps else 0.0,
                       last_call_s=0.0, front_end="tensorflow")


def clock_now() -> float:
    """The latest end of this process's IPU timelines (modelled seconds)."""
    return max((line.now_s for line in clock.timelines().values()), default=0.0)


def compile_facts(model, strategy, concrete, forward_flops: int, train_flops: int,
                  batch: int, input_bytes: int, G: int, spe: int) -> None:
    """Plan and place ``model``'s memory (raises as :func:`place`) and keep what its
    :func:`model_report` needs; called once per compile, before the first step."""
    system = get_system()
    ipu = system.replica_context(0).ipus[0]
    memory_plan = plan(model, strategy, concrete, G, system.memory[ipu.id].capacity_bytes)
    capacity = place(memory_plan, f"{model.name}/")
    memory = {i: {**memory_plan.breakdown(0), "capacity": cap} for i, cap in capacity.items()}
    params = int(sum(np.prod(v.shape.as_list()) for v in model.trainable_variables))
    saved, _ = saved_activation_bytes(concrete)
    version = ipu.version
    f32 = np.float32
    host = host_transfer_time_s(system.model, ipu.id, input_bytes) if system.model else 0.0
    forward_s = clock.compute_time_s(forward_flops, f32, version)
    backward_s = clock.compute_time_s(max(0, train_flops - forward_flops), f32, version)
    from collectives.step_model import WEIGHT_UPDATE_FLOPS_PER_PARAM
    update_s = clock.compute_time_s(WEIGHT_UPDATE_FLOPS_PER_PARAM * params, f32, version)
    pipeline_s = G * (host + forward_s + backward_s)
    optimizer_bytes = memory_plan.breakdown(0)["optimizer_state"]
    model.__dict__["_ipu_fns"]["model_facts"] = dict(
        name=model.name, training=True, schedule="single stage",
        stages=[StageReport(0, 0, (), float(forward_flops),
                            float(max(0, train_flops - forward_flops)), 0.0, saved,
                            input_bytes, 1, forward_s, backward_s)],
        micro_batch=batch, gradient_accumulation=G, device_iterations=spe,
        replicas=system.num_local_replicas, global_replicas=system.num_replicas,
        ipus_per_replica=1, recompute=False, memory=memory,
        planned_step_s=(pipeline_s + update_s) / G, pipeline_s=pipeline_s / G,
        weight_update_s=update_s / G, bubble_fraction=0.0,
        assumptions=memory_plan.assumptions,
        card=dict(params=params, flops_per_item=train_flops / batch, stage_shares=[1.0],
                  grad_dtype="float32", input_bytes_per_item=input_bytes // batch,
                  optimizer_state_bytes_per_param=optimizer_bytes / params if params else 0.0,
                  optimizer_state_in="sram"),
        steps_run=[0], clock_start_s=clock_now())
    register(model)


def count_steps(model, steps: int) -> None:
    """Add ``steps`` (micro-batches of every replica) to ``model``'s steps run."""
    facts = model.__dict__.get("_ipu_fns", {}).get("model_facts")
    if facts is not None:
        facts["steps_run"][0] += steps


def offer_card(model) -> None:
    """Put ``model``'s card in the run report's step estimate
    (:func:`collectives.performance.run_report.use_model_card`)."""
    report = model_report(model)
    if report is None or not report.card.get("flops_per_item") or not report.card.get("params"):
        return
    from collectives.performance.model_card import ModelCard
    from collectives.performance.run_report import use_model_card
    use_model_card(ModelCard.from_run(run=report), micro_batch=report.micro_batch,
                   gradient_accumulation=report.gradient_accumulation)


def register(model) -> None:
    """Include ``model`` (held weakly) in the run report's ``tensorflow`` section."""
    with _lock:
        if not any(ref() is model for ref in _models):
            _models.append(weakref.ref(model))
        if _registered["done"]:
            return
        _registered["done"] = True
    from collectives.performance.run_report import add_report_section
    add_report_section("tensorflow", report_section)


def report_section() -> dict:
    """``{"models": [ModelReport.to_dict()], "summary": str, "breakdown": {label: s}}`` of
    the Keras models alive that were compiled for the IPUs."""
    with _lock:
        models = [m for m in (ref() for ref in _models) if m is not None]
    reports = [r for r in map(model_report, models) if r is not None]
    breakdown = {}
    for r in reports:
        if r.steps:
            breakdown[f"{r.name}: modelled step"] = r.step_s
            for stage in r.stages:
                breakdown[f"{r.name}: stage {stage.stage} forward"] = stage.forward_s
                breakdown[f"{r.name}: stage {stage.stage} backward"] = stage.backward_s
    return {"models": [r.to_dict() for r in reports],
            "summary": "\n".join(r.table() for r in reports if r.steps),
            "breakdown": breakdown}
