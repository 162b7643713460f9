"""A pipelined Keras graph model cut into per-stage callables (reference §5.1 rules).

The model's layer calls (nodes) run in Keras' own order (``_nodes_by_depth``, deepest
first, as ``Functional._run_internal_graph``); stage s runs its nodes on the tensors that
the model's inputs and the earlier stages produced, and passes on every tensor a later stage
or the model's outputs need. A layer call runs exactly as in ``model(x)``
(``node.map_arguments``, ``node.layer(*args, **kwargs)``), so each stage computes the same
numbers as the unsplit model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

__all__ = ["StageCut", "graph_nodes", "node_index", "cut_model"]


def graph_nodes(model: Any) -> list:
    """The model's layer calls in Keras' execution order (input nodes left out).

    Raises:
        ValueError: a model that is not a graph network (a ``Model`` subclass, or a
            Sequential model without an input shape).
    """
    if not getattr(model, "_is_graph_network", False):
        raise ValueError(
            f"Model {model.name} is not a graph network (a subclassed Model, or a Sequential "
            "model built without an input shape): ipupod pipelines Functional and Sequential "
            "models whose inputs are known")
    out = []
    for depth in sorted(model._nodes_by_depth, reverse=True):
        out.extend(n for n in model._nodes_by_depth[depth] if not n.is_input)
    return out


def node_index(node: Any) -> int:
    """Which call of its layer ``node`` is (0: the first)."""
    return node.layer._inbound_nodes.index(node)


class _Once:
    """What ``Node.map_arguments`` pops a tensor from (Keras keeps a list per use)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def pop(self):
        return self.value


@dataclass
class StageCut:
    """The model's nodes per stage and the tensors that cross each stage boundary (ids as
    Keras keys them, ``str(id(keras_tensor))``)."""

    model: Any
    stages: list[list] = field(default_factory=list)
    input_ids: list[str] = field(default_factory=list)
    output_ids: list[str] = field(default_factory=list)
    passed_after: list[list[str]] = field(default_factory=list)  # per stage s < S-1

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def run_stage(self, s: int, live: dict[str, tf.Tensor], training: bool) -> dict:
        """Run stage ``s``'s layer calls on ``live`` (id -> tensor); adds their outputs."""
        for node in self.stages[s]:
            args, kwargs = node.map_arguments({k: _Once(v) for k, v in live.items()})
            if "training" not in kwargs:
                kwargs = dict(kwargs, training=training)
            outputs = node.layer(*args, **kwargs)
            for x_id, y in zip(node.flat_output_ids, tf.nest.flatten(outputs)):
                live[x_id] = y
        return live

    def model_outputs(self, live: dict) -> Any:
        """The model's outputs, nested as the model returns them."""
        return tf.nest.pack_sequence_as(self.model._nested_outputs,
                                        [live[i] for i in self.output_ids])

    def stage_variables(self, s: int) -> list:
        """The trainable variables of the layers stage ``s`` calls (first-use order)."""
        seen, out = set(), []
        for node in self.stages[s]:
            for var in node.layer.trainable_weights:
                if var.ref() not in seen:
                    seen.add(var.ref())
                    out.append(var)
        return out


def cut_model(model: Any, stage_of: list[int]) -> StageCut:
    """Cut ``model`` by ``stage_of`` (one stage per node of :func:`graph_nodes`).

    Raises:
        ValueError: GK's rules (reference §5.1): a stage with no layer ("All stages in a
            pipeline must have at lease one layer assigned to them. ..."), a layer that
            consumes a later stage's output ("Layer L in pipeline stage S has a dependency
            from a pipeline stage which has not yet been executed. ..."); fewer than two
            stages ("Pipeline requires at least two computational stages.").
    """
    nodes = graph_nodes(model)
    num_stages = max(stage_of) + 1
    cut = StageCut(model, [[] for _ in range(num_stages)])
    for node, s in zip(nodes, stage_of):
        cut.stages[s].append(node)
    if any(not st for st in cut.stages):
        raise ValueError(
            "All stages in a pipeline must have at lease one layer assigned to them. Stages "
            f"{[i for i, st in enumerate(cut.stages) if not st]} have none.")
    if num_stages < 2:
        raise ValueError("Pipeline requires at least two computational stages.")
    produced_in: dict[str, int] = {}
    cut.input_ids = [str(id(t)) for t in tf.nest.flatten(model._nested_inputs)]
    for i in cut.input_ids:
        produced_in[i] = -1
    last_use: dict[str, int] = {}
    for s, stage in enumerate(cut.stages):
        for node in stage:
            for x_id in node.flat_input_ids:
                if produced_in.get(x_id, num_stages) > s:
                    raise ValueError(
                        f"Layer {node.layer.name} in pipeline stage {s} has a dependency from "
                        "a pipeline stage which has not yet been executed. Layers can only "
                        "use outputs from current or previous pipeline stages.")
                last_use[x_id] = max(last_use.get(x_id, -1), s)
            for x_id in node.flat_output_ids:
                produced_in[x_id] = s
    cut.output_ids = [str(id(t)) for t in tf.nest.flatten(model._nested_outputs)]
    for x_id in cut.output_ids:
        last_use[x_id] = num_stages
    cut.passed_after = [
        [x for x, p in produced_in.items() if p <= s < last_use.get(x, -1)]
        for s in range(num_stages - 1)]
    return cut
