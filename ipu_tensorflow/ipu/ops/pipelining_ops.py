"""``tensorflow.python.ipu.ops.pipelining_ops``: TF-IPU's functional pipeline on TF stage
functions (TFI ``ipu/ops/pipelining_ops.py``; seed 004:3940-4150; reference
execution-model.md §1, tf-keras-ipu.md §5.4-5.5).

    def stage1(x, y):
        return dense1(x), y
    def stage2(h, y):
        return tf.reduce_mean(tf.square(dense2(h) - y))
    def optimizer_function(loss):
        return pipelining_ops.OptimizerFunctionOutput(tf.keras.optimizers.SGD(0.1), loss)

    @tf.function
    def step():
        return pipelining_ops.pipeline([stage1, stage2], gradient_accumulation_count=4,
                                       repeat_count=2, infeed_queue=infeed,
                                       outfeed_queue=outfeed,
                                       optimizer_function=optimizer_function)
    strategy.run(step)          # or ipu_compiler.compile(step) under ipu_scope

:func:`pipeline` builds ONE stateful TF op (in eager code it runs at once). When the op runs,
for the replica it runs for, the stages run on ipupod's pipeline runtime
(:func:`ipu_node.pipelining_ops.pipeline`: the schedules the numpy and PopTorch pipelines
use, the stages on the replica's IPUs by ``device_mapping``, the gradient accumulation, the
weight update once per repeat, the outfeed rules and the modelled clock), each stage's TF ops
run eagerly with their gradients from ``tf.GradientTape`` and the optimizer a TF/Keras
optimizer (:mod:`ipu_tensorflow._tf_stages`). The arguments' rules and messages are
the runtime's (TF-IPU's); the ones that need no replica are checked when the op is built.

The enums (``PipelineSchedule``, ``RecomputationMode``, ``PipelineStageOptions``,
``GradientAccumulationReductionMethod``) are ipu_node's own objects, so Keras' pipelining
options take either; :func:`last_report` is the runtime's report of the last run.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable

import tensorflow as tf
from ipu_node import current_replica_context
from ipu_node.pipelining_ops import (GradientAccumulationReductionMethod, PipelineReport,
                                     PipelineSchedule, PipelineStageOptions,
                                     RecomputationMode, StepRecord, check_arguments,
                                     last_report)
from ipu_node.pipelining_ops import pipeline as _numpy_pipeline

from ipu_tensorflow import _bridge
from ipu_tensorflow._tf_stages import StagedPipeline, TFOptimizerFunctionOutput

__all__ = ["pipeline", "PipelineSchedule", "RecomputationMode", "PipelineStageOptions",
           "OptimizerFunctionOutput", "recomputation_checkpoint", "last_report",
           "PipelineReport", "StepRecord", "GradientAccumulationReductionMethod"]

OptimizerFunctionOutput = TFOptimizerFunctionOutput

#: TF-IPU's signature of ``pipeline``: ipu_node's (the one list of its parameters and defaults)
_SIGNATURE = inspect.signature(_numpy_pipeline)
#: the arguments this module handles; the others go to ipu_node's runtime as they are
_OWN = ("computational_stages", "inputs", "infeed_queue", "outfeed_queue",
        "optimizer_function")


def recomputation_checkpoint(tensors, name: str | None = None):
    """``tensors`` unchanged (TF-IPU marks a recomputation checkpoint; ipupod recomputes
    whole stages, so the mark changes no number)."""
    return tensors


def _numpy_queue(queue):
    """The ipu_node queue under a TF feed (or the object itself when it is one)."""
    return getattr(queue, "_queue", queue) if queue is not None else None


def _infeed_taker(infeed) -> Callable | None:
    """``take()`` -> the calling replica's next element (numpy) of ``infeed``: a TF-side
    ``IPUInfeedQueue``, an ipu_node infeed, or a strategy's dataset iterator."""
    if infeed is None:
        return None
    take = getattr(infeed, "next_numpy_element", None)
    if take is not None:
        return take
    inner = _numpy_queue(infeed)
    if not callable(getattr(inner, "next_element", None)):
        raise TypeError("infeed_queue must be an IPUInfeedQueue (or an iterator of the "
                        f"strategy's dataset), not {type(infeed).__name__}")
    return inner.next_element


def _check_early(stages, gradient_accumulation_count, optimizer_function) -> None:
    """The checks TF-IPU makes when the op is built (PO:639-646, 862-864)."""
    if not isinstance(stages, (list, tuple)) or len(stages) < 2:
        raise ValueError("Pipeline requires at least two computational stages.")
    for i, stage in enumerate(stages):
        if not callable(stage):
            raise TypeError(f"computational_stages[{i}] must be callable, not "
                            f"{type(stage).__name__}")
    if gradient_accumulation_count is None:
        raise ValueError("gradient_accumulation_count must be specified.")
    if optimizer_function is not None and not callable(optimizer_function):
        raise TypeError("optimizer_function must be callable, not "
                        f"{type(optimizer_function).__name__}")


@contextlib.contextmanager
def _strategy_entered(strategy):
    """``strategy``'s scope and a TF replica context of it, as ``strategy.run`` enters them,
    where none is entered: the op runs in a thread of TF's executor, and a variable it
    makes there (a stage's, an optimizer's slot) must get a copy per local replica as those
    made while building do."""
    if strategy is None or tf.distribute.has_strategy():
        yield
        return
    with strategy.scope(), tf.distribute.ReplicaContext(strategy, replica_id_in_sync_group=0):
        yield


@tf.autograph.experimental.do_not_convert
def pipeline(*args, **kwargs):
    """Run ``repeat_count`` executions of a pipeline of ``gradient_accumulation_count`` (G)
    micro-batches over the replica's IPUs (seed 004:4007's parameters and defaults, plus
    HEAD's ``reduction_method``: the signature is :func:`ipu_node.pipelining_ops.pipeline`'s).

    Stage ``i``'s outputs are stage ``i+1``'s arguments (a tuple or list positionally, a
    dict of str keys as keyword arguments, anything else as one argument); stage 0 receives
    ``inputs`` followed by the dequeued infeed element. Training (``optimizer_function``
    set): ``optimizer_function(*last_stage_outputs)`` returns an
    :class:`OptimizerFunctionOutput` whose loss is one of those outputs; the gradients of
    every trainable variable the stages read are accumulated over the G micro-batches (SUM
    by default) and applied once per repeat by that optimizer (the first one returned: TF-IPU
    calls ``optimizer_function`` once). The outfeed gets what reference §1.5 says: inference
    the last stage's outputs per micro-batch; training the unmasked outputs as a list, the
    loss with ``outfeed_loss``, their sum per repeat with ``accumulate_outfeed``.

    Each local replica runs its own pipeline on its own copy of every variable made in the
    strategy's scope (:mod:`ipu_tensorflow._replica_variables`; the variables and optimizer
    slots the op makes included): its stages read its copies and its weight update writes
    them with its own accumulated gradients. As in TF-IPU, the gradients are reduced across
    replicas only by the optimizer (``ipu.optimizers.CrossReplicaOptimizer``: their mean,
    once per repeat; reference §1.4), which keeps the replicas' weights equal.

    Must be built in a replica function (``strategy.run``, ``ipu_compiler.compile``).

    Returns:
        The pipeline's ``tf.Operation`` in a ``tf.function``; None in eager code (it ran).

    Raises:
        TypeError: an argument the signature does not have.
        ValueError, TypeError: when built: fewer than two stages ("Pipeline requires at
            least two computational stages."), G missing ("gradient_accumulation_count must
            be specified."), a stage or ``optimizer_function`` not callable. When it runs
            (``strategy.run`` re-raises them as they are): the runtime's rules with TF-IPU's
            messages (G negative, device_mapping, schedule or mode not an enum member,
            outfeed options, ...); the loss not among the last stage's outputs; a gradient
            accumulation optimizer.
        FailedPreconditionError: G not a multiple of the schedule's overlap length, or
            below it (reference §1.3).
        NotInReplicaError: outside a replica function.
    """
    bound = _SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    computational_stages, inputs, infeed_queue, outfeed_queue, optimizer_function = (
        arguments[k] for k in _OWN)
    _check_early(computational_stages, arguments["gradient_accumulation_count"],
                 optimizer_function)
    options = {k: v for k, v in arguments.items() if k not in _OWN}
    staged = StagedPipeline(list(computational_stages), optimizer_function)
    take = _infeed_taker(infeed_queue)
    outfeed = _numpy_queue(outfeed_queue)
    if hasattr(outfeed_queue, "note_enqueue_built"):   # (the op enqueues when it runs)
        outfeed_queue.note_enqueue_built()
    structure = list(inputs) if inputs is not None else []
    if inputs is not None and not isinstance(inputs, (list, tuple)):
        raise TypeError(f"inputs must be a list or a tuple, not {type(inputs).__name__}")
    leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(structure)]
    if current_replica_context() is not None:   # (built in a replica: check it now)
        training = optimizer_function is not None
        try:
            check_arguments([staged.stage(s, training) for s in range(len(staged.fns))],
                            inputs=structure, infeed_queue=infeed_queue,
                            outfeed_queue=outfeed, optimizer_function=optimizer_function,
                            **options)
        except Exception as exc:
            # as raised (AutoGraph would turn ipu_node's error types, whose constructors
            # take more than a message, into a StagingError; strategy.run must see
            # WiderReplicasNeeded to widen the replicas)
            exc.ag_pass_through = True
            if hasattr(exc, "ag_error_metadata"):
                del exc.ag_error_metadata
            raise

    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None

    def execute(*tensors):
        with _strategy_entered(strategy):
            staged.run(tf.nest.pack_sequence_as(structure, list(tensors)), take, outfeed,
                       options)

    return _bridge.call_eager(execute, leaves, "pipelining_ops.pipeline")


pipeline.__signature__ = _SIGNATURE
