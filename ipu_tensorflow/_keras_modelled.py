"""The modelled time of a Keras training step on ipupod's IPUs (DESIGN.md, "Step model"):
FLOPs counted from the traced training function with TensorFlow's own profiler
(``tensorflow.python.profiler.model_analyzer``, ``float_operation``: the graph's ops with
registered FLOP statistics: MatMul, Conv2D and their backward ops, element-wise ops, ...),
priced on each replica's IPU timeline (:mod:`ipu_node.clock`) as the numpy and PopTorch front
ends price theirs:

1. ``host_io``: the window's input bytes from the host (:func:`ipu_node.host_transfer_time_s`);
2. ``compute``: the window's G micro-batches' training FLOPs at the chip's float32 peak times
   ``compute_efficiency`` (:func:`ipu_node.clock.compute_time_s`);
3. the gradient reduction: charged by the collectives themselves (``cross_replica_sum``);
4. the weight update: ``WEIGHT_UPDATE_FLOPS_PER_PARAM`` per trainable parameter
   (:mod:`collectives.step_model`, an ipupod assumption) at the float32 peak.

The memory of the model on each IPU and the out-of-memory error are
:mod:`ipu_tensorflow._keras_memory`'s. What is not modelled yet: recomputation, and a
per-operation price (matmuls on the AMP units by shape): the compute term is FLOPs at an
efficiency, as :func:`ipu_node.clock.compute_time_s`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from ipu_node import clock, current_replica_context, get_system, host_transfer_time_s

__all__ = ["graph_flops", "charge_window", "charge_update", "modelled_step_s"]


def graph_flops(concrete) -> int:
    """Floating-point operations of one call of ``concrete`` (a ``ConcreteFunction`` with
    static shapes), by TensorFlow's profiler; 0 when it counts none."""
    from tensorflow.python.profiler import model_analyzer, option_builder
    options = (option_builder.ProfileOptionBuilder(
        option_builder.ProfileOptionBuilder.float_operation()).with_empty_output().build())
    try:
        return int(model_analyzer.profile(graph=concrete.graph, options=options)
                   .total_float_ops)
    except Exception:   # (a graph the profiler cannot walk: no compute term)
        return 0


def _element_nbytes(element) -> int:
    return int(sum(np.prod(t.shape) * t.dtype.size for t in tf.nest.flatten(element)
                   if t is not None))


def charge_window(elements: list, flops_per_step: int) -> None:
    """In a replica thread: the window's input from the host and its compute, on the
    replica's first IPU."""
    ctx = current_replica_context()
    if ctx is None or not ctx.ipus:
        return
    ipu = ctx.ipus[0]
    model = get_system().model
    line = clock.timeline(ipu.id)
    if model is not None:
        line.add("host_io", host_transfer_time_s(model, ipu.id, sum(map(_element_nbytes,
                                                                          elements))),
                 "keras input")
    line.add("compute", clock.compute_time_s(flops_per_step * len(elements), np.float32,
                                             ipu.version), "keras training step")


def charge_update(params: int) -> None:
    """In a replica thread: the optimizer's update of ``params`` parameter elements."""
    from collectives.step_model import WEIGHT_UPDATE_FLOPS_PER_PARAM
    ctx = current_replica_context()
    if ctx is None or not ctx.ipus:
        return
    ipu = ctx.ipus[0]
    clock.timeline(ipu.id).add(
        "compute", clock.compute_time_s(WEIGHT_UPDATE_FLOPS_PER_PARAM * params, np.float32,
                                        ipu.version), "weight update")


def modelled_step_s(steps: int) -> float:
    """Modelled seconds per step: the latest IPU timeline's end over ``steps`` (a step: one
    micro-batch of every replica)."""
    lines = clock.timelines()
    end = max((line.now_s for line in lines.values()), default=0.0)
    return end / steps if steps else 0.0
