"""``tensorflow.python.ipu.loops``: ``repeat`` and ``while_loop`` on TF tensors (TFI
``ipu/loops.py:33-227``; reference tf-keras-ipu.md §6.3).

A loop is a ``tf.while_loop`` in the ``tf.function`` that ``strategy.run`` runs on every
replica; each iteration dequeues the replica's element of the infeed (one TF op,
:meth:`ipu_tensorflow.ipu.ipu_infeed_queue.IPUInfeedQueue.next_element`: ipu_node's element
assignment). The calling convention is ipu_node's (:mod:`ipu_node.loops`, the same
``body_arguments`` and ``check_arity``): ``body(*carried, *infeed_element)``, a dict element
as keyword arguments; the body returns its new carried tensors, then any operations (an
outfeed's ``enqueue``), which run before the next iteration. Outside a ``tf.function`` the
loop runs eagerly.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf
from ipu_node.loops import body_arguments, check_arity

__all__ = ["repeat", "while_loop"]


def _as_list(values: Any) -> list:
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _is_operation(value: Any) -> bool:
    return value is None or isinstance(value, tf.Operation)


def _split_outputs(outputs: Any, input_types: list) -> tuple[list, list]:
    """The carried tensors and the operations of one body result, checked as TF-IPU does."""
    outputs = [] if outputs is None else _as_list(outputs)
    count = next((i for i, o in enumerate(outputs) if _is_operation(o)), len(outputs))
    tensors, operations = outputs[:count], outputs[count:]
    if not all(_is_operation(o) for o in operations):
        raise ValueError("IPU loop body must return zero or more Tensor values followed by "
                         "zero or more Operations.")
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    output_types = [t.dtype for t in tensors]
    if output_types != input_types:
        raise TypeError("Mismatch between input types and output types for loop body: "
                        f"{input_types} vs {output_types}.")
    return tensors, [o for o in operations if o is not None]


def _loop(condition, body, inputs, infeed_queue, maximum_iterations) -> Any:
    carried = [tf.convert_to_tensor(x) for x in ([] if inputs is None else _as_list(inputs))]
    input_types = [t.dtype for t in carried]

    def cond(i, *values):
        go = tf.convert_to_tensor(condition(*values))
        return go if maximum_iterations is None else tf.logical_and(i < maximum_iterations, go)

    def step(i, *values):
        args, kwargs = ([], {}) if infeed_queue is None else \
            body_arguments(infeed_queue.next_element())
        tensors, operations = _split_outputs(body(*values, *args, **kwargs), input_types)
        with tf.control_dependencies(operations):
            return [tf.identity(i + 1)] + [tf.identity(t) for t in tensors]

    final = tf.while_loop(cond, step, [tf.constant(0, tf.int32)] + carried)
    if infeed_queue is not None and not infeed_queue.dequeued:   # (TFI loops.py, a courtesy)
        raise ValueError("The infeed queue has not been dequeued.")
    final = _as_list(final)
    if not carried:
        return None if tf.executing_eagerly() else final[0].op
    return final[1] if len(carried) == 1 else final[1:]


def while_loop(condition: Callable[..., Any], body: Callable[..., Any], inputs: Any = None,
               infeed_queue: Any = None, maximum_iterations: int | None = None,
               use_while_v1: bool = True) -> Any:
    """Run ``body`` while ``condition(*carried)`` is true, at most ``maximum_iterations``
    times (None: no bound).

    Args:
        condition: takes the carried tensors (never the infeed element); a bool tensor.
        body: takes the carried tensors, then the infeed element (module docstring).
        inputs: the initial carried values (a list, one value, or None).
        infeed_queue: an ``IPUInfeedQueue`` dequeued once per iteration, or None.
        maximum_iterations: an int >= 0 or None.
        use_while_v1: accepted (TF-IPU's; no effect).

    Returns:
        The final carried tensors: one bare, several as a list; with none, the loop's
        ``tf.Operation`` (None in eager code).

    Raises:
        TypeError: ``body`` or ``condition`` cannot take the inputs (TF-IPU's message);
            the body's output dtypes differ from the inputs'.
        ValueError: the body returns operations before tensors; a bad
            ``maximum_iterations``; the infeed was never dequeued (an eager loop of no
            iterations: "The infeed queue has not been dequeued.").
    """
    if maximum_iterations is not None and (
            isinstance(maximum_iterations, bool) or
            not isinstance(maximum_iterations, (int, np.integer)) or maximum_iterations < 0):
        raise ValueError(f"maximum_iterations must be None or >= 0, got {maximum_iterations!r}")
    carried = [] if inputs is None else _as_list(inputs)
    check_arity("body", body, carried, infeed_queue)
    check_arity("condition", condition, carried, None)
    return _loop(condition, body, inputs, infeed_queue, maximum_iterations)


def repeat(n: int, body: Callable[..., Any], inputs: Any = None, infeed_queue: Any = None,
           use_while_v1: bool = True) -> Any:
    """Run ``body`` exactly ``n`` times (:func:`while_loop` with a true condition): the
    loop of TF-IPU's custom training loops [004:1906-1953].

    Raises:
        ValueError: ``n`` is not an integer >= 0; see :func:`while_loop` for the rest.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"loops.repeat needs an integer n >= 0, got {n!r}")
    carried = [] if inputs is None else _as_list(inputs)
    check_arity("body", body, carried, infeed_queue)
    return _loop(lambda *_: True, body, inputs, infeed_queue, int(n))
