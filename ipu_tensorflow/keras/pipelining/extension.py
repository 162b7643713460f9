"""The pipelining part of the Keras extension (GK ``functional_extensions.py:180-264,
454-621``, ``sequential_extensions.py:509-683``, ``extensions_base.py:341-447,1223-1311``;
reference tf-keras-ipu.md §5).

:class:`PipeliningExtension` is a mixin of the IPU Keras extension class: the pipeline-stage
assignment methods, ``set_pipelining_options`` with TF-IPU's validation and messages, the
replication factor from the stages, and the per-replica pipelined execution that ``fit``,
``evaluate`` and ``predict`` run for a pipelined model (:meth:`_pipeline_window`), over
ipu_node's pipeline runtime (:mod:`ipu_tensorflow.keras.pipelining._run`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import tensorflow as tf

from ipu_node.pipelining_ops import PipelineSchedule

from ipu_tensorflow._keras_options import parse_accumulation_reduction
from ipu_tensorflow.keras.pipelining._cut import StageCut, cut_model, graph_nodes, node_index
from ipu_tensorflow.keras.pipelining._run import PipelineRun
from ipu_tensorflow.keras.pipelining.pipeline_stage_assignment import (
    FunctionalLayerPipelineStageAssignment, FunctionalNestedModelPipelineStageAssignment,
    SequentialLayerPipelineStageAssignment, SequentialNestedModelPipelineStageAssignment,
    stage_of_node)

__all__ = ["PipeliningExtension", "replication_factor", "refuse_overrides"]

#: ``pipelining_kwargs`` keys that ``set_pipelining_options`` refuses (GK
#: ``extensions_base.py:1223-1311``), with the message's tail
_REFUSED_KWARGS = {
    "gradient_accumulation_count": "Set the `gradient_accumulation_steps_per_replica` "
                                   "argument to `set_pipelining_options` instead.",
    "device_mapping": "Set the `device_mapping` argument to `set_pipelining_options` "
                      "instead.",
    "accumulate_outfeed": "Set the `accumulate_outfeed` argument to "
                          "`set_pipelining_options` instead.",
    **{key: "This argument is automatically set by Keras." for key in (
        "computational_stages", "repeat_count", "inputs", "infeed_queue", "outfeed_queue",
        "optimizer_function")},
    **{key: "This argument is not compatible with Keras." for key in (
        "outfeed_loss", "outfeed_mask", "batch_serialization_iterations")},
}


def replication_factor(num_ipus: int, shards: int) -> int:
    """Replicas of a pipelined model of ``shards`` shards on ``num_ipus`` IPUs:
    ``num_ipus // 2**ceil(log2(shards))`` (GK ``extensions_base.py:394-416``).

    Raises:
        ValueError: "Current device has N IPUs attached, however the current model requires a
            multiple of M IPUs." (M the shards rounded up to a power of two).
    """
    needed = 2 ** math.ceil(math.log2(shards)) if shards > 1 else 1
    if num_ipus < needed or num_ipus % needed:
        raise ValueError(f"Current device has {num_ipus} IPUs attached, however the current "
                         f"model requires a multiple of {needed} IPUs.")
    return num_ipus // needed


def refuse_overrides(model: Any, original: type, checks: list) -> None:
    """Refuse a model class that overrides one of ``checks`` (``(method name, the class
    whose method it must be)``).

    Raises:
        RuntimeError: GK's message, the method's name substituted (``extensions_base.py:
            1042-1054,1089-1095,1126-1132``; reference §4.6).
    """
    for name, owner in checks:
        if getattr(original, name) is not getattr(owner, name):
            raise RuntimeError(
                f"The function `{name}` for the model {model.name} has been overridden. "
                "This is not supported when using Keras within an IPUStrategy. Either "
                "remove the override from your model definition or set "
                "`enable_keras_extensions=False` when creating the IPUStrategy.")


def _sum_over_replicas(grads: list) -> list:
    """A replica's accumulated gradients summed over every replica of the job (ONE fused
    ``collectives.cross_replica_sum``). One function, so that every window of a model reuses
    its :class:`PipelineRun` (the runs are cached by their reduction)."""
    from collectives import cross_replica_sum
    return cross_replica_sum(grads, name="gradients")


def _positive_g(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or
                              value < 1):
        raise ValueError("Expected `gradient_accumulation_steps_per_replica` to be a positive "
                         f"integer, but got {value} instead.")


class PipeliningExtension:
    """The pipelining methods of an IPU Keras model (Functional or Sequential; a ``Model``
    subclass is refused when pipelined: ipupod cuts graph networks only)."""

    # -- state ------------------------------------------------------------------------------
    def _pipelining_state(self) -> dict:
        state = self.__dict__.get("_ipu_pipelining")
        if state is None:
            state = {"assignment": None, "G": None, "device_mapping": None,
                     "accumulate_outfeed": None,
                     "reduction": parse_accumulation_reduction("sum"),
                     "kwargs": {}, "runs": {}}
            self.__dict__["_ipu_pipelining"] = state
        return state

    def _is_sequential_model(self) -> bool:
        from tf_keras.src.engine.sequential import Sequential
        return isinstance(self, Sequential)

    # -- assignment -------------------------------------------------------------------------
    def _tagged_assignment(self) -> list:
        sequential = self._is_sequential_model()
        out = []
        for node in graph_nodes(self):
            layer = node.layer
            nested = hasattr(layer, "layers") and hasattr(layer, "_is_graph_network")
            if sequential:
                cls = (SequentialNestedModelPipelineStageAssignment if nested
                       else SequentialLayerPipelineStageAssignment)
            else:
                cls = (FunctionalNestedModelPipelineStageAssignment if nested
                       else FunctionalLayerPipelineStageAssignment)
            out.append(cls(layer, node_index(node), stage_of_node(node)))
        return out

    def get_pipeline_stage_assignment(self) -> list:
        """The stage of every layer call, in Keras' execution order: the assignment set by
        :meth:`set_pipeline_stage_assignment`, else the stages ``PipelineStage`` tagged
        (``pipeline_stage`` None where none was)."""
        state = self._pipelining_state()
        if state["assignment"] is not None:
            return list(state["assignment"])
        return self._tagged_assignment()

    def set_pipeline_stage_assignment(self, pipeline_stage_assignment: list) -> None:
        """Assign every layer call to a stage: the list :meth:`get_pipeline_stage_assignment`
        returns with ``pipeline_stage`` set, or (Sequential models) a list of ints, one per
        layer.

        Raises:
            ValueError: a length that does not match the graph's layer calls (GK's message);
                an unassigned call; a Sequential assignment that does not start at 0 or
                skips a stage.
        """
        template = self._tagged_assignment()
        given = list(pipeline_stage_assignment)
        if len(given) != len(template):
            raise ValueError(
                f"The length of the provided `pipeline_stage_assignment` ({len(given)}) does "
                f"not match the number of layers in the graph ({len(template)}). Each layer "
                "in the graph must be assigned to a pipeline stage.")
        out = []
        for slot, item in zip(template, given):
            stage = item if isinstance(item, int) else getattr(item, "pipeline_stage", None)
            if isinstance(item, int) and not self._is_sequential_model():
                raise ValueError("The provided `pipeline_stage_assignment` must be a list of "
                                 "FunctionalLayerPipelineStageAssignment objects (as "
                                 "`get_pipeline_stage_assignment()` returns).")
            if not isinstance(item, int) and getattr(item, "layer", None) is not slot.layer:
                raise ValueError(f"The provided `pipeline_stage_assignment` does not match "
                                 f"the graph: {item} where layer {slot.layer.name} (node "
                                 f"index {slot.node_index}) is expected.")
            self._check_assigned(slot.layer, stage)
            out.append(type(slot)(slot.layer, slot.node_index, stage))
        if self._is_sequential_model():
            self._check_sequential([a.pipeline_stage for a in out])
        self._pipelining_state()["assignment"] = out
        self._pipeline_reset()

    def reset_pipeline_stage_assignment(self) -> None:
        """Make the model not pipelined: every layer call unassigned (the ``PipelineStage``
        tags included)."""
        self._pipelining_state()["assignment"] = [
            type(a)(a.layer, a.node_index, None) for a in self._tagged_assignment()]
        self._pipeline_reset()

    def print_pipeline_stage_assignment_summary(self, line_length: int | None = None,
                                                print_fn: Callable | None = None) -> None:
        """Print a table of the layer calls and their stages (GK's default width: 89
        Functional, 60 Sequential)."""
        print_fn = print_fn or print
        width = line_length or (60 if self._is_sequential_model() else 89)
        cols = ([0.55, 1.0] if self._is_sequential_model() else [0.4, 0.75, 1.0])
        heads = (["Layer (type) (node index)", "Pipeline Stage"] if len(cols) == 2 else
                 ["Layer (type) (node index)", "Input Layers", "Pipeline Stage"])
        stops = [int(width * c) for c in cols]

        def row(fields):
            line = ""
            for field, stop in zip(fields, stops):
                line = (line + str(field))[:stop - 1].ljust(stop)
            print_fn(line.rstrip())
        print_fn(f'Model: "{self.name}"')
        print_fn("_" * width)
        row(heads)
        print_fn("=" * width)
        for a in self.get_pipeline_stage_assignment():
            name = f"{a.layer.name} ({type(a.layer).__name__}) ({a.node_index})"
            fields = [name, a.pipeline_stage]
            if len(cols) == 3:
                fields.insert(1, ", ".join(layer.name for layer in a.inbound_layers))
            row(fields)
        print_fn("=" * width)

    @staticmethod
    def _check_assigned(layer: Any, stage: Any) -> None:
        if stage is None:
            raise ValueError(
                "All layers of a pipelined model must have an associated pipeline stage. "
                f"However, {layer.name} has not been assigned to one. Pipeline stages can be "
                "assigned when a layer is constructed, or each time a layer is called. "
                "Different pipeline stages can assigned to each call.")
        if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
            raise ValueError(f"{stage!r} is not a valid pipeline stage (layer {layer.name}).")

    @staticmethod
    def _check_sequential(stages: list[int]) -> None:
        if stages and stages[0] != 0:
            raise ValueError("The first layer of a pipelined Sequential model must be "
                             f"assigned to pipeline stage 0, not {stages[0]}.")
        for i, (a, b) in enumerate(zip(stages, stages[1:])):
            if b not in (a, a + 1):
                raise ValueError(f"Layer {i + 1} of a pipelined Sequential model is assigned "
                                 f"to pipeline stage {b}, after a layer in stage {a}: each "
                                 "layer must be in the same stage as the previous layer or "
                                 "the next one.")

    def _pipeline_stages(self) -> list[int] | None:
        """The stage of each layer call, or None when the model is not pipelined.

        Raises:
            ValueError: some calls tagged and others not (GK's message).
        """
        assignment = self.get_pipeline_stage_assignment()
        if not any(a.pipeline_stage is not None for a in assignment):
            return None
        for a in assignment:
            self._check_assigned(a.layer, a.pipeline_stage)
        return [a.pipeline_stage for a in assignment]

    def _is_pipelined(self) -> bool:
        """Whether some layer call has a stage (set or tagged)."""
        if not getattr(self, "_is_graph_network", False):
            return False
        return any(a.pipeline_stage is not None for a in self.get_pipeline_stage_assignment())

    # -- options ----------------------------------------------------------------------------
    def set_pipelining_options(self, gradient_accumulation_steps_per_replica=None,
                               device_mapping=None, accumulate_outfeed=None,
                               gradient_accumulation_reduction_method="sum",
                               **pipelining_kwargs) -> None:
        """The options of the pipelined model (GK ``functional_extensions.py:180-264``):
        G, the gradient accumulation count per replica (required by ``fit``); the IPU
        (shard) of each stage; ``accumulate_outfeed``; the reduction (SUM default,
        MEAN, RUNNING_MEAN); and ``pipelining_ops.pipeline``'s other arguments
        (``pipeline_schedule``: Grouped default, Interleaved, Sequential;
        ``recomputation_mode``; the offload and ``*_poplar_options`` ones, recorded).
        Schedule and recomputation change modelled time and memory, never the numbers.

        Raises:
            ValueError: G not a positive int; ``device_mapping`` not a list of ints; a
                refused key in ``pipelining_kwargs`` (GK's messages, reference §5.2); a
                bad reduction method.
        """
        _positive_g(gradient_accumulation_steps_per_replica)
        if device_mapping is not None and (
                not isinstance(device_mapping, list) or
                not all(isinstance(d, int) and not isinstance(d, bool) for d in device_mapping)):
            raise ValueError("Expected `device_mapping` to be a list of integers, but got "
                             f"{device_mapping!r} instead.")
        for key in pipelining_kwargs:
            if key in _REFUSED_KWARGS:
                raise ValueError(f"Found `{key}` key in `pipelining_kwargs`. "
                                 f"{_REFUSED_KWARGS[key]}")
        schedule = pipelining_kwargs.get("pipeline_schedule")
        if schedule is not None and not isinstance(schedule, PipelineSchedule):
            raise ValueError(f"`pipeline_schedule` must be a PipelineSchedule, not "
                             f"{schedule!r}.")
        state = self._pipelining_state()
        state.update(G=gradient_accumulation_steps_per_replica, device_mapping=device_mapping,
                     accumulate_outfeed=accumulate_outfeed,
                     reduction=parse_accumulation_reduction(
                         gradient_accumulation_reduction_method),
                     kwargs=dict(pipelining_kwargs))
        self._pipeline_reset()

    def _pipeline_reset(self) -> None:
        self._pipelining_state()["runs"] = {}
        reset = getattr(self, "_ipu_reset_functions", None)
        if reset is not None:
            reset()

    # -- replication and checks -------------------------------------------------------------
    def _pipeline_shards(self) -> int:
        stages = self._pipeline_stages()
        mapping = self._pipelining_state()["device_mapping"]
        if mapping:
            return max(mapping) + 1
        return max(stages) + 1

    def _get_replication_factor(self, num_ipus: int | None = None) -> int:
        """Replicas of this pipelined model on ``num_ipus`` IPUs (None: the configured
        device's, per instance): :func:`replication_factor`."""
        if num_ipus is None:
            from ipu_node import get_system
            num_ipus = len(get_system().devices[0].ipus)
        return replication_factor(num_ipus, self._pipeline_shards())

    def _check_pipelined_training(self, steps_per_execution: int) -> int:
        """G for a pipelined ``fit`` (reference §5.3).

        Raises:
            ValueError: G not set ("The model which you are attempting to train is
                pipelined, however `gradient_accumulation_steps_per_replica` has not been set
                through `set_pipelining_options()`. ...").
            RuntimeError: G does not divide ``steps_per_execution``.
        """
        g = self._pipelining_state()["G"]
        if g is None:
            raise ValueError(
                "The model which you are attempting to train is pipelined, however "
                "`gradient_accumulation_steps_per_replica` has not been set through "
                "`set_pipelining_options()`. You need to set this value as pipelined models "
                "will perform gradient accumulation when training.")
        if steps_per_execution % g:
            raise RuntimeError(
                "The pipelined model has been configured to use gradient accumulation for "
                "training, however the current `steps_per_execution` value (set to "
                f"{steps_per_execution}) is not divisible by "
                f"`gradient_accumulation_steps_per_replica` ({g}). You need to adjust either "
                "`steps_per_execution` or `gradient_accumulation_steps_per_replica` to make "
                "sure that `steps_per_execution` is divisible by "
                "`gradient_accumulation_steps_per_replica`.")
        return g

    def _ensure_pipeline_layout(self) -> int:
        """Give each replica the IPUs the stages need (``2**ceil(log2(shards))``, as TF-IPU
        derives the replication factor) before the replicas run; the replication factor.

        Raises:
            ValueError: too few IPUs (:func:`replication_factor`).
        """
        from ipu_node import get_system
        from ipu_node.runtime.system import widen_replicas

        self._pipeline_check_overrides()
        system = get_system()
        factor = self._get_replication_factor(len(system.devices[0].ipus))
        per_replica = len(system.devices[0].ipus) // factor
        if system.ipus_per_replica < per_replica:
            widen_replicas(per_replica)
        return factor

    def _pipeline_check_overrides(self) -> None:
        """A pipelined model runs its layer calls stage by stage, not its own step functions
        or ``call`` (GK ``extensions_base.py:1098-1103,1135-1140``,
        ``functional_extensions.py:623-630``).

        Raises:
            RuntimeError: ``test_step``, ``predict_step`` or ``call`` overridden
                (:func:`refuse_overrides`).
        """
        from tf_keras.src.engine import functional, sequential, training

        original = getattr(type(self), "__original_class__", type(self))
        base = sequential.Sequential if self._is_sequential_model() else functional.Functional
        checks = [("test_step", training.Model), ("predict_step", training.Model),
                  ("call", base)]
        refuse_overrides(self, original, checks)

    # -- execution ----------------------------------------------------------------------------
    def _pipeline_cut(self) -> StageCut:
        runs = self._pipelining_state()["runs"]
        cut = runs.get("cut")
        if cut is None:
            cut = runs["cut"] = cut_model(self, self._pipeline_stages())
        return cut

    def _pipeline_run(self, reduce_gradients: Callable | None) -> PipelineRun:
        runs = self._pipelining_state()["runs"]
        key = ("run", reduce_gradients)
        run = runs.get(key)
        if run is None:
            run = runs[key] = PipelineRun(self._pipeline_cut(), reduce_gradients)
        return run

    def _pipeline_window(self, elements: list, training: bool,
                         reduce_gradients: Callable | None = None, compute_loss=None,
                         compute_metrics=None) -> tuple[list, list | None]:
        """One pipeline execution in the calling replica: ``len(elements)`` micro-batches
        (``(x, y, sample_weight)``; ``(x,)`` to predict), G of them in training (the
        reference's ``repeat_count = spe / G`` is the caller's loop over windows), all of
        them in inference (reference §5.3). Returns what the last stage outfed per
        micro-batch and, in training, the accumulated (and reduced) gradients as
        ``[(tf.Tensor, tf.Variable)]`` for :meth:`_pipeline_apply` (once per instance).

        Raises:
            FailedPreconditionError: G (or, in inference, the micro-batches) not a multiple
                of the schedule's overlap length (reference §5.3, §8 #21).
        """
        state = self._pipelining_state()
        run = self._pipeline_run(reduce_gradients)
        kwargs = dict(state["kwargs"])
        kwargs.setdefault("pipeline_schedule", PipelineSchedule.Grouped)
        if training:
            kwargs["reduction_method"] = state["reduction"].name
        outputs = run.run(elements, len(elements), training,
                          device_mapping=state["device_mapping"], compute_loss=compute_loss,
                          compute_metrics=compute_metrics, **kwargs)
        return outputs, (run.take_gradients() if training else None)

    def _pipeline_device_mapping(self) -> list[int]:
        """The replica's IPU index of each stage (``device_mapping``, default stage i on
        IPU i)."""
        mapping = self._pipelining_state()["device_mapping"]
        return list(mapping) if mapping is not None else \
            list(range(self._pipeline_cut().num_stages))

    def _pipeline_compile_memory(self, G: int) -> None:
        """At compile (the first ``fit``): the optimizer state, gradient accumulators and
        code of each stage on its IPU, on every local replica (:mod:`._account`; raises
        ``ipu_node.IPUOutOfMemoryError`` before any step when they do not fit)."""
        from ipu_tensorflow.keras.pipelining._account import place_state
        place_state(self, self.distribute_strategy, G)

    def _pipeline_record_report(self, element, G: int, spe: int) -> None:
        """After the first training window: the model's report facts from the runtime's
        report of local replica 0 (:mod:`._account`)."""
        from ipu_node.pipelining_ops import last_report
        from ipu_tensorflow.keras.pipelining._account import element_nbytes, record_report
        report = last_report()
        runs = [r for k, r in self._pipelining_state()["runs"].items() if k != "cut"]
        if report is None or not runs:
            return
        batch = int(tf.nest.flatten(element[0])[0].shape[0])
        record_report(self, runs[-1], report, batch, element_nbytes(element), G, spe)

    def _pipeline_apply(self, grads_and_vars: list) -> None:
        """Apply one window's reduced gradients with the model's optimizer (call once per
        instance, after the replicas' windows)."""
        self.optimizer.apply_gradients(grads_and_vars)

    # -- the Keras extension's fit, evaluate and predict --------------------------------------
    def _pipeline_G(self) -> int:
        """G of a pipelined ``fit`` (raises GK's ValueError when unset, reference §8 #14)."""
        return self._check_pipelined_training(self._pipelining_state()["G"] or 1)

    def _pipeline_reduction(self):
        """The gradient accumulation reduction of the pipeline (SUM, MEAN, RUNNING_MEAN)."""
        return self._pipelining_state()["reduction"]

    @staticmethod
    def _containers_fns(loss_container, metrics_container, model) -> tuple:
        def compute_loss(x, y, y_pred, sample_weight):
            return loss_container(y, y_pred, sample_weight,
                                  regularization_losses=model.losses)

        def compute_metrics(x, y, y_pred, sample_weight):
            metrics_container.update_state(y, y_pred, sample_weight)
        compute_loss.loss_container = loss_container   # (the pipeline's trace reuses it)
        return compute_loss, compute_metrics

    def _pipeline_train_window(self, elements: list, loss_container,
                               metrics_container) -> list:
        """A replica's training window of ``fit``: its G micro-batches ``(x, y,
        sample_weight)`` through the pipeline, with the replica's own loss and metrics
        containers; returns the gradients summed over every replica of the job (one fused
        ``collectives.cross_replica_sum``), in ``trainable_variables`` order, for the
        extension's once-per-instance apply."""
        loss_fn, metrics_fn = self._containers_fns(loss_container, metrics_container, self)
        _, pairs = self._pipeline_window(elements, True, _sum_over_replicas, loss_fn,
                                         metrics_fn)
        by_var = {v.ref(): g for g, v in pairs}
        return [by_var[v.ref()] if v.ref() in by_var else tf.zeros_like(v)
                for v in self.trainable_variables]

    def _pipeline_test_window(self, elements: list, loss_container,
                              metrics_container) -> None:
        """A replica's ``evaluate`` execution: all its micro-batches through the inference
        pipeline (G = spe, reference §5.3), updating its loss and metrics containers."""
        loss_fn, metrics_fn = self._containers_fns(loss_container, metrics_container, self)
        self._pipeline_window(elements, False, None, loss_fn, metrics_fn)

    def _pipeline_predict_window(self, elements: list) -> list:
        """A replica's ``predict`` execution: per micro-batch its predictions (numpy)."""
        return [out[0] for out in self._pipeline_window([(e[0],) for e in elements],
                                                        False)[0]]
