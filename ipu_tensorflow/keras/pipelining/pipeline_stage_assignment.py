"""Which pipeline stage each layer call of a Keras model runs in (GK
``keras/ipu/extensions/pipeline_stage_assignment.py``; reference tf-keras-ipu.md §5.1).

:class:`PipelineStage` is the context manager of Graphcore's Keras: a layer *constructed*
inside ``with PipelineStage(s):`` gets stage s for all its calls; a layer *called* inside
tags that call (node), and the call's stage wins. Graphcore's Keras fork records both in
``Layer.__init__`` and in node creation; on stock tf-keras, the first ``PipelineStage``
entered wraps tf-keras' ``Layer.__init__`` and ``Layer.__call__`` once, and the wrappers
read the stage from the current strategy (``strategy._pipeline_stage``, as GK keeps it); with
no stage set they only pass through.

The assignment value classes are those ``get_pipeline_stage_assignment`` returns and
``set_pipeline_stage_assignment`` takes.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import tensorflow as tf

__all__ = ["PipelineStage", "FunctionalLayerPipelineStageAssignment",
           "FunctionalNestedModelPipelineStageAssignment",
           "SequentialLayerPipelineStageAssignment",
           "SequentialNestedModelPipelineStageAssignment", "ModelLayerPipelineStageAssignment",
           "ModelNestedModelPipelineStageAssignment", "stage_of_layer", "stage_of_node"]

_hooks_lock = threading.Lock()
_hooks_installed = [False]


def _current_stage() -> int | None:
    if not tf.distribute.has_strategy():
        return None
    return getattr(tf.distribute.get_strategy(), "_pipeline_stage", None)


def _install_hooks() -> None:
    """Wrap tf-keras' ``Layer.__init__`` and ``Layer.__call__`` once (GK's fork does this
    in ``base_layer.py:442-445`` and ``node.py:116-118``)."""
    from tf_keras.src.engine import base_layer

    with _hooks_lock:
        if _hooks_installed[0]:
            return
        layer_cls = base_layer.Layer
        original_init, original_call = layer_cls.__init__, layer_cls.__call__

        @functools.wraps(original_init)
        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            stage = _current_stage()
            if stage is not None:
                self._pipeline_stage = stage

        @functools.wraps(original_call)
        def __call__(self, *args, **kwargs):
            stage = _current_stage()
            if stage is None:
                return original_call(self, *args, **kwargs)
            before = len(self._inbound_nodes)
            out = original_call(self, *args, **kwargs)
            for node in self._inbound_nodes[before:]:
                node._pipeline_stage = stage
            return out

        layer_cls.__init__, layer_cls.__call__ = __init__, __call__
        _hooks_installed[0] = True


def stage_of_node(node: Any) -> int | None:
    """The stage a layer call was tagged with (its call's, else its layer's), or None."""
    stage = getattr(node, "_pipeline_stage", None)
    return stage if stage is not None else stage_of_layer(node.layer)


def stage_of_layer(layer: Any) -> int | None:
    """The stage a layer was constructed in, or None."""
    return getattr(layer, "_pipeline_stage", None)


def _is_ipu_strategy(strategy: Any) -> bool:
    from ipu_tensorflow.ipu.ipu_strategy import IPUStrategyV1
    return isinstance(strategy, IPUStrategyV1)


class PipelineStage:
    """``with PipelineStage(stage):``: layers constructed or called inside are assigned to
    pipeline stage ``stage`` (an int >= 0) of a Functional model or a ``Model`` subclass
    (Sequential models use ``set_pipeline_stage_assignment``). Only inside an
    ``IPUStrategy`` scope: ``PopDistStrategy`` is not an ``IPUStrategyV1``, so it raises
    there too (reference §3.2; programs assign stages with ``set_pipeline_stage_assignment``
    instead).

    Raises:
        ValueError: a negative stage: the literal "%d is not a valid pipeline stage." (GK's
            unformatted string).
        RuntimeError: "PipelineStage may only be used from within an IPUStrategy context.";
            "Pipeline stages must not be nested."
    """

    def __init__(self, stage: int):
        self._stage = stage

    def __enter__(self) -> "PipelineStage":
        if self._stage < 0:
            raise ValueError("%d is not a valid pipeline stage.")
        strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
        if strategy is None or not _is_ipu_strategy(strategy):
            raise RuntimeError("PipelineStage may only be used from within an IPUStrategy "
                               "context.")
        if hasattr(strategy, "_pipeline_stage"):
            raise RuntimeError("Pipeline stages must not be nested.")
        _install_hooks()
        strategy._pipeline_stage = self._stage
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        strategy = tf.distribute.get_strategy()
        if hasattr(strategy, "_pipeline_stage"):
            delattr(strategy, "_pipeline_stage")


class _Assignment:
    """A layer (or nested model) call and the pipeline stage it runs in."""

    _kind = "Layer"

    def __init__(self, layer: Any, node_index: int = 0, pipeline_stage: int | None = None):
        self._layer = layer
        self._node_index = node_index
        self.pipeline_stage = pipeline_stage

    @property
    def layer(self) -> Any:
        """The Keras layer of this assignment."""
        return self._layer

    @property
    def node_index(self) -> int:
        """Which call of the layer (0: its first call)."""
        return self._node_index

    @property
    def inbound_layers(self) -> list:
        """The layers whose outputs this call consumes (tells calls of a layer apart)."""
        node = self._layer._inbound_nodes[self._node_index]
        return [n.layer for n in node.parent_nodes]

    @property
    def pipeline_stage(self) -> int | None:
        """The stage, or None while unassigned."""
        return self._pipeline_stage

    @pipeline_stage.setter
    def pipeline_stage(self, value: int | None) -> None:
        self._pipeline_stage = value

    def __str__(self) -> str:
        return (f"{self._kind}: {self.layer.name} (node index {self.node_index}) is assigned "
                f"to pipeline stage: {self.pipeline_stage}")

    __repr__ = __str__


class FunctionalLayerPipelineStageAssignment(_Assignment):
    """One call of a layer of a Functional model and its stage (GK's class of that name)."""


class FunctionalNestedModelPipelineStageAssignment(_Assignment):
    """One call of a nested model of a Functional model; the whole nested model runs in
    that stage (ipupod: nested models are not split further)."""

    _kind = "Model"


class SequentialLayerPipelineStageAssignment(_Assignment):
    """A layer of a Sequential model and its stage."""


class SequentialNestedModelPipelineStageAssignment(_Assignment):
    """A nested model of a Sequential model and its stage."""

    _kind = "Model"


class ModelLayerPipelineStageAssignment(_Assignment):
    """A layer call of a ``Model`` subclass and its stage."""


class ModelNestedModelPipelineStageAssignment(_Assignment):
    """A nested model call of a ``Model`` subclass and its stage."""

    _kind = "Model"
