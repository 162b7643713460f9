"""One execution of a pipelined Keras model in the calling replica, through ipu_node's
pipeline runtime (:func:`ipu_node.pipelining_ops.pipeline`: the schedules, the gradient
accumulation and the modelled clock the numpy and PopTorch pipelines use).

Each stage of the :class:`~ipu_tensorflow.keras.pipelining._cut.StageCut` becomes an
``ipu_node`` ``Stage``: its forward calls the replica's traced function of the stage's layer
calls under a ``tf.GradientTape`` and hands numpy arrays on (so the runtime sizes the copies
between IPUs; the stash it accounts is the stage's activations: its inputs and every layer
output, held until the backward pass); its backward is ``tape.gradient`` of the stage's
outputs with the gradients the next stage sent back, keyed by an ``ipu_node.Variable`` that
stands for each ``tf.Variable`` (it accounts the weight's bytes on the stage's IPU). The last
stage computes the loss as ``train_step`` does (``model.compute_loss``), in its traced function
(so Keras computes a softmax or sigmoid output's cross-entropy from the logits, as in the
unpipelined step's graph, not from the probabilities as it does eagerly); the runtime sums the
micro-batch gradients in ascending order from zeros and applies them once per ``G``
micro-batches with the model's optimizer, so the weights equal the unpipelined model trained
with the same gradient accumulation, bit for bit. FLOPs per stage come from TensorFlow's
profiler on the traced stage (the front end's ``graph_flops``).

**Random numbers** (Dropout, GaussianNoise, ...). Each local replica calls its own traced
function of each stage, as each replica of the unpipelined model calls its own traced step
(:func:`ipu_tensorflow._keras_run.fit`): a random op in it takes its seeds when it is traced,
from TensorFlow's global seed and the op's place in the model (the stage's graph numbers its
seedless random ops on from where the earlier stages' left off, so the op seeds are those of
the model's unpipelined step), and draws from its own kernel, advanced once per micro-batch.
So a replica's numbers depend neither on the other replicas' threads nor on how the replicas
are laid out over instances, and equal the unpipelined model's. Eagerly run layer calls would
instead take their op seeds from the one process-wide eager context in whatever order the
replica threads reach them.
"""

from __future__ import annotations

import threading

from typing import Any, Callable

import tensorflow as tf
from ipu_node import current_replica_context
from ipu_node.pipelining_ops import (OptimizerFunctionOutput, PipelineSchedule, Stage,
                                     last_report, pipeline)
from tensorflow.python.framework import random_seed as _random_seed

from ipu_tensorflow._keras_modelled import graph_flops
from ipu_tensorflow._tf_stages import HandOver, VariableProxies
from ipu_tensorflow.keras.pipelining._cut import StageCut

__all__ = ["PipelineRun", "MicroBatches"]

_Y, _SW = "__ipupod_y__", "__ipupod_sample_weight__"


class MicroBatches:
    """The infeed of one execution: the replica's micro-batches ``(x, y, sample_weight)``
    (numpy nests), dequeued in order."""

    def __init__(self, elements: list):
        self._elements = list(elements)
        self._next = 0

    def next_element(self):
        """The next micro-batch (the infeed protocol of ipu_node's pipeline runtime)."""
        element = self._elements[self._next]
        self._next += 1
        return element


class _Outfeed:
    """Collects what the last stage outfeeds (the loss, then the other outputs)."""

    def __init__(self):
        self.items: list = []

    def enqueue(self, value):
        self.items.append(value)


def _numpy(nest: Any) -> Any:
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, nest)


def _tensors(nest: Any) -> Any:
    return None if nest is None else tf.nest.map_structure(tf.convert_to_tensor, nest)


def _signature(nest: Any) -> tuple:
    """What a traced function is specialised on: each tensor's shape and dtype (None as
    itself), keys included."""
    if isinstance(nest, dict):
        return tuple((k, _signature(v)) for k, v in nest.items())
    return tuple(None if t is None else (tuple(t.shape), t.dtype)
                 for t in tf.nest.flatten(nest))


class PipelineRun:
    """The stages of one pipelined model for one replica, reusable across executions.

    Args:
        cut: the model cut into stages.
        reduce_gradients: ``fn(list of numpy arrays) -> list`` applied to a replica's
            accumulated gradients in the weight update (the strategy's cross-replica sum,
            ONE fused ``collectives.cross_replica_sum``); None: as they are.
    """

    def __init__(self, cut: StageCut, reduce_gradients: Callable | None = None):
        self.cut = cut
        self.model = cut.model
        self.reduce_gradients = reduce_gradients
        self.proxies = VariableProxies()
        self._flops: dict = {}     # (stage, training) -> FLOPs per micro-batch
        # (local replica, stage, training, inputs, loss) -> the replica's traced stage
        self._traced: dict = {}
        self._seed_counts: dict = {}   # (stage, training) -> seedless random ops it traced
        self._trace_lock = threading.Lock()  # (Keras layers are traced by one thread at a time)
        self._update = HandOver(self, "KerasPipelineWeightUpdate")
        self._reduced: dict = {}   # local replica index -> its reduced gradients
        self._local = threading.local()  # the running replica's loss and metrics functions
        self._shared_lock = threading.Lock()
        self.saved_bytes: dict[int, int] = {}  # stage -> bytes it stashes per micro-batch
        self.input_bytes: dict[int, int] = {}  # stage > 0 -> bytes it receives per micro-batch

    # -- the stages -----------------------------------------------------------------------
    def _live_of(self, s: int, args: tuple, kwargs: dict) -> tuple[dict, Any, Any]:
        """The stage's input tensors by id, and the labels and sample weights it carries."""
        if s == 0:
            x, y, sw = (tuple(args) + (None, None))[:3]
            flat = tf.nest.flatten(x)
            live = {i: tf.convert_to_tensor(v) for i, v in zip(self.cut.input_ids, flat)}
            return live, y, sw
        y, sw = kwargs.pop(_Y, None), kwargs.pop(_SW, None)
        return {k: tf.convert_to_tensor(v) for k, v in kwargs.items()}, y, sw

    def _stage_function(self, s: int, live: dict, training: bool, labels=None):
        """The calling replica's stage ``s`` traced for ``live``'s inputs (id -> tensor): a
        ``ConcreteFunction`` of ``(inputs, None)`` returning the tensors the stage's layer
        calls add (id -> tensor); given ``labels`` ``(y, sample_weight)`` (the last stage,
        training or evaluating), of ``(inputs, labels)`` returning ``(those tensors, the
        loss)`` by the replica's ``compute_loss``. Traced once per replica, stage, mode,
        loss and input signature, one trace at a time; its FLOPs are counted at the first
        trace of the stage and mode (without the loss)."""
        ctx = current_replica_context()
        key = (0 if ctx is None else ctx.local_index, s, training, _signature(live),
               None if labels is None else (_signature(labels), self._local.loss_key))
        concrete = self._traced.get(key)
        if concrete is None:
            with self._trace_lock:
                concrete = tf.function(self._stage_body(s, training)).get_concrete_function(
                    dict(live), labels)
                self._traced[key] = concrete
                if labels is None and (s, training) not in self._flops:
                    self._flops[(s, training)] = float(graph_flops(concrete))
        return concrete

    def _stage_body(self, s: int, training: bool) -> Callable:
        """What :meth:`_stage_function` traces: stage ``s``'s layer calls, its seedless random
        ops numbered on from the earlier stages' (``random_seed.get_seed`` numbers them per
        graph from 0, so the stages' graphs give them the op seeds of the one unpipelined
        graph when the earlier stages were traced first, as the pipeline's first forward
        passes trace them)."""
        def body(live: dict, labels):
            graph = tf.compat.v1.get_default_graph()
            first = sum(self._seed_counts.get((t, training), 0) for t in range(s))
            _random_seed._graph_to_seed_dict[graph] = first
            out = self.cut.run_stage(s, dict(live), training)
            self._seed_counts[(s, training)] = \
                _random_seed._graph_to_seed_dict.get(graph, first) - first
            added = {k: v for k, v in out.items() if k not in live}
            if labels is None:
                return added
            y, sw = labels
            return added, self._local.compute_loss(None, y, self.cut.model_outputs(out), sw)
        return body

    def stage_flops(self, s: int, training: bool = True) -> float:
        """Stage ``s``'s FLOPs of one forward pass (0 before it ran)."""
        return self._flops.get((s, training), 0.0)

    def _stage(self, s: int, training: bool) -> Stage | Callable:
        cut, last = self.cut, s == self.cut.num_stages - 1

        def run(args: tuple, kwargs: dict, tape: tf.GradientTape | None, held=None):
            live, y, sw = self._live_of(s, args, dict(kwargs))
            inputs = dict(live)
            if tape is not None:
                tape.watch([t for t in inputs.values() if t.dtype.is_floating])
            if last and y is not None:    # (training, evaluate: the loss in the trace too)
                labels = (_tensors(y), _tensors(sw))
                added, loss = self._stage_function(s, inputs, training, labels)(inputs, labels)
            else:
                added = self._stage_function(s, inputs, training)(inputs, None)
            live.update(added)
            if held is not None:   # the activations the backward pass keeps (the stash)
                held.extend(v.numpy() for v in live.values() if isinstance(v, tf.Tensor))
                self.saved_bytes[s] = sum(h.nbytes for h in held)
                if s > 0:
                    self.input_bytes[s] = sum(t.numpy().nbytes for t in inputs.values())
            if last:
                y_pred = cut.model_outputs(live)
                if y is None:             # predict
                    return inputs, (_numpy(y_pred),), None
                y, sw = labels
                return inputs, (loss.numpy(), y, _numpy(y_pred), sw), [loss]
            passed = {k: live[k] for k in cut.passed_after[s]}
            out = {k: v.numpy() for k, v in passed.items()}
            out[_Y], out[_SW] = y, sw
            return inputs, out, passed

        def flops(*args, **kwargs):
            """The stage's FLOPs for these inputs (counted once per stage and mode)."""
            if (s, training) not in self._flops:
                self._stage_function(s, self._live_of(s, args, dict(kwargs))[0], training)
            return self._flops[(s, training)]

        if not training:
            def infer(*args, **kwargs):
                outputs = run(args, kwargs, None)[1]
                if last and len(outputs) > 1:   # evaluate: the metrics of this micro-batch
                    self._metrics(*outputs)
                return outputs
            infer.flops = flops   # (the runtime reads a stage's ``flops``)
            return infer

        variables = cut.stage_variables(s)

        def forward(*args, **kwargs):
            with tf.GradientTape() as tape:
                held: list = []
                inputs, outputs, targets = run(args, kwargs, tape, held)
            return outputs, (tape, inputs, targets, held)

        def backward(saved, output_grads):
            tape, inputs, targets, _ = saved
            if last:
                pairs = [(targets[0], tf.convert_to_tensor(output_grads[0]))]
            else:
                pairs = [(t, tf.convert_to_tensor(output_grads[k]))
                         for k, t in targets.items()
                         if isinstance(output_grads, dict) and output_grads.get(k) is not None]
            floats = [k for k, t in inputs.items() if t.dtype.is_floating]
            if not pairs:
                return {}, {}
            grads = tape.gradient([t for t, _ in pairs], variables + [inputs[k] for k in floats],
                                  output_gradients=[g for _, g in pairs])
            var_grads = {self.proxies.proxy(v): (None if g is None else g.numpy())
                         for v, g in zip(variables, grads[:len(variables)])}
            in_grads = {k: g.numpy() for k, g in zip(floats, grads[len(variables):])
                        if g is not None}
            return var_grads, in_grads

        return Stage(forward, backward, flops=flops)

    def _metrics(self, loss, y, y_pred, sw) -> None:
        self._local.compute_metrics(None, _tensors(y), _tensors(y_pred), _tensors(sw))

    def _shared(self, fn: Callable) -> Callable:
        """``fn`` (the model's own loss or metrics, which every replica would update)
        called by one replica at a time (the loss: traced into the last stage, once per
        replica, so the lock orders its traces; its runs are the replicas' own)."""
        def locked(*args):
            with self._shared_lock:
                return fn(*args)
        return locked

    # -- the weight update ----------------------------------------------------------------
    def apply_gradients(self, grads_and_vars) -> None:
        """The runtime's weight update in this replica: the accumulated gradients (numpy,
        in the runtime's order), reduced across replicas by ``reduce_gradients`` (one fused
        collective, charged to the IPUs' timelines in the update phase), kept for
        :meth:`take_gradients`; the model's optimizer applies them once per instance."""
        pairs = [(g, self.proxies.variable(v)) for g, v in grads_and_vars]
        grads = [g for g, _ in pairs]
        if self.reduce_gradients is not None:
            grads = list(self.reduce_gradients(grads))
        self._reduced[current_replica_context().local_index] = [
            (tf.convert_to_tensor(g), v) for g, (_, v) in zip(grads, pairs)]

    def take_gradients(self) -> list:
        """The calling replica's reduced gradients of its last training run,
        ``[(tf.Tensor, tf.Variable)]`` (empty before any)."""
        return self._reduced.pop(current_replica_context().local_index, [])

    # -- one execution --------------------------------------------------------------------
    def run(self, elements: list, gradient_accumulation_count: int, training: bool,
            repeat_count: int = 1, device_mapping=None,
            pipeline_schedule: PipelineSchedule | None = None, compute_loss=None,
            compute_metrics=None, **pipelining_kwargs) -> list:
        """Run ``repeat_count`` pipeline executions of ``gradient_accumulation_count``
        micro-batches from ``elements`` (``(x, y, sample_weight)`` each; ``(x,)`` to
        predict) in this replica. Returns per micro-batch what the last stage outfed:
        training and evaluate ``(loss, y, y_pred, sample_weight)``, predict ``(y_pred,)``.

        ``compute_loss(x, y, y_pred, sample_weight)`` and ``compute_metrics(...)`` default to
        the model's (``train_step``'s); a caller running several replicas passes each
        replica's own loss and metrics containers. ``compute_loss`` is traced into the last
        stage (TF ops on TF tensors); its ``loss_container`` attribute, where it has one,
        names it across calls (a new callable of the same container reuses the trace).

        Raises:
            NotInReplicaError: outside a replica function.
            FailedPreconditionError, ValueError: the pipeline's rules (G against the
                schedule's overlap length, device_mapping, ...; reference §5.3).
        """
        outfeed = _Outfeed()
        self._local.compute_loss = compute_loss or self._shared(self.model.compute_loss)
        self._local.loss_key = getattr(compute_loss, "loss_container", compute_loss)
        self._local.compute_metrics = compute_metrics or self._shared(
            self.model.compute_metrics)
        stages = [self._stage(s, training) for s in range(self.cut.num_stages)]

        def optimizer_function(loss, *rest):
            self._metrics(loss, *rest)
            return OptimizerFunctionOutput(self._update, loss)
        pipeline(stages, gradient_accumulation_count, repeat_count=repeat_count,
                 infeed_queue=MicroBatches(elements), outfeed_queue=outfeed,
                 optimizer_function=optimizer_function if training else None,
                 device_mapping=device_mapping, pipeline_schedule=pipeline_schedule,
                 **pipelining_kwargs)
        return outfeed.items

    @staticmethod
    def last_report():
        """The runtime's report of this replica's last run (modelled steps, busy time,
        bubble fraction, stash depth per stage)."""
        return last_report() if current_replica_context() is not None else None
