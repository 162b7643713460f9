"""On-device loops: ``loops.repeat`` and ``loops.while_loop`` [004:1906-1953].

Eager: the body runs now, once per iteration, in the calling (replica) thread. The calling
convention and the errors are TF-IPU's (``tensorflow/python/ipu/loops.py``):

* ``body(*carried, *infeed_element)``; an infeed element that is a dict, or a 1-tuple holding
  a dict, goes in as ``**kwargs`` (TF's ``_body_arguments``).
* The body returns its new carried values, then any Operations (such as an outfeed enqueue):
  ``return v, outfeed_queue.enqueue(v)``. Anything else in another order raises ValueError.
* Output dtypes must equal the input dtypes (TypeError). Python scalars are typed as TF types
  them: float -> float32, int -> int32, bool -> bool.
* One carried value comes back bare, several as a list, none as an :class:`Operation`.

The loop being run is visible to other parts of the runtime through :func:`current_loop`
(for example ``GradientAccumulationOptimizerV2`` checks that the loop's iteration count is a
multiple of its ``num_mini_batches``), and each iteration is one *step* for outfeeds
(:func:`current_step`: an outfeed may be enqueued once per step).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ipu_node.execution.operation import Operation

__all__ = ["repeat", "while_loop", "current_loop", "current_step", "LoopInfo", "frame",
           "body_arguments", "check_arity"]

_local = threading.local()
_serials = itertools.count()


@dataclass
class LoopInfo:
    """A loop (or a compiled computation) running in this thread.

    Attributes:
        kind: ``"repeat"``, ``"while_loop"``, ``"compile"``, or another runtime loop's name
            (:func:`frame` takes any; every kind but ``"compile"`` counts as a loop).
        iterations: the loop's iteration count: ``n`` of ``repeat``, ``maximum_iterations`` of
            ``while_loop`` (None when unbounded), 1 for ``compile``.
        iteration: the iteration running now, from 0.
        serial: a number unique to this loop run (steps of different runs never compare equal).
    """

    kind: str
    iterations: int | None
    iteration: int
    serial: int


def _stack() -> list[LoopInfo]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current_loop() -> LoopInfo | None:
    """The innermost ``repeat``/``while_loop`` running in this thread, or None outside one.

    ``current_loop().iterations`` is the loop's iteration count (``n`` of ``repeat(n, ...)``).
    """
    for info in reversed(_stack()):
        if info.kind != "compile":
            return info
    return None


def current_step() -> tuple[int, int] | None:
    """``(serial, iteration)`` of the innermost loop iteration or compiled computation running
    in this thread; None outside both. Outfeeds allow one enqueue per step."""
    stack = _stack()
    if not stack:
        return None
    return stack[-1].serial, stack[-1].iteration


@contextlib.contextmanager
def frame(kind: str, iterations: int | None = 1) -> Iterator[LoopInfo]:
    """Run a block as a loop (or compiled computation) of ``kind``: pushes a
    :class:`LoopInfo` for :func:`current_loop` / :func:`current_step` (runtime use)."""
    info = LoopInfo(kind, iterations, 0, next(_serials))
    stack = _stack()
    stack.append(info)
    try:
        yield info
    finally:
        stack.pop()


def to_tensor(value: Any) -> np.ndarray:
    """A loop value as numpy: Python scalars typed as TF types them (float32, int32, bool)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value  # (np.float64 is a float subclass: keep its dtype)
    if isinstance(value, bool):
        return np.asarray(value, np.bool_)
    if isinstance(value, int):
        return np.asarray(value, np.int32)
    if isinstance(value, float):
        return np.asarray(value, np.float32)
    return np.asarray(value)


def _as_list(values: Any) -> list:
    return list(values) if isinstance(values, (list, tuple)) else [values]


def body_arguments(element: Any) -> tuple[list, dict]:
    """TF's ``_body_arguments``: a dict (or a 1-sequence of a dict) becomes keyword args.
    Returns ``(args, kwargs)``; any front end's loops call it (the TF one on TF tensors)."""
    items = _as_list(element)
    if len(items) == 1 and isinstance(items[0], dict):
        return [], dict(items[0])
    return items, {}


def _needs(fn: Callable, count: int) -> str | None:
    """Why ``fn`` cannot take ``count`` positional arguments ("exactly 2 arguments", ...),
    or None when it can (TF's ``xla.check_function_argument_count``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    most = None if varargs else len(positional)
    plural = lambda n: f"{n} argument{'s' if n != 1 else ''}"  # noqa: E731
    if count < required:
        return (f"exactly {plural(required)}" if most == required
                else f"at least {plural(required)}")
    if most is not None and count > most:
        return f"exactly {plural(most)}" if most == required else f"at most {plural(most)}"
    return None


def check_arity(what: str, fn: Callable, inputs: list, infeed_queue: Any) -> None:
    """Whether ``fn`` (the loop ``what``: "body" or "condition") takes ``inputs`` plus the
    infeed element's ``number_of_tuple_elements`` arguments.

    Raises:
        TypeError: it cannot, with TF's message ("Supplied loop body function cannot be
            called with the specified inputs. ...").
    """
    extra = infeed_queue.number_of_tuple_elements if infeed_queue is not None else 0
    error = _needs(fn, len(inputs) + extra)
    if error is None:
        return
    if infeed_queue is None:
        raise TypeError(
            f"Supplied loop {what} function cannot be called with the specified inputs. You "
            f"specified {len(inputs)} inputs: {inputs}, but the loop {what} needs {error}.")
    raise TypeError(
        f"Supplied loop {what} function cannot be called with the specified inputs. You "
        f"specified {len(inputs)} inputs: {inputs} and {extra} additional inputs from "
        f"infeed, but the computation needs {error}.")


def _dtypes(values: list) -> list[str]:
    return [np.asarray(v).dtype.name for v in values]


def _split_outputs(outputs: Any, input_types: list[str]) -> list:
    """The carried values of one body result, checked as TF checks them."""
    if outputs is None:
        outputs = ()
    outputs = _as_list(outputs)
    tensors = [to_tensor(o) for o in outputs if not isinstance(o, Operation)]
    if any(isinstance(o, Operation) for o in outputs[:len(tensors)]) or \
            any(not isinstance(o, Operation) for o in outputs[len(tensors):]):
        raise ValueError("IPU loop body must return zero or more Tensor values followed by "
                         "zero or more Operations.")
    output_types = _dtypes(tensors)
    if output_types != input_types:
        raise TypeError("Mismatch between input types and output types for loop body: "
                        f"{input_types} vs {output_types}.")
    return tensors


def while_loop(condition: Callable[..., Any], body: Callable[..., Any], inputs: Any = None,
               infeed_queue: Any = None, maximum_iterations: int | None = None,
               use_while_v1: bool = True) -> Any:
    """Run ``body`` while ``condition(*carried)`` is true (at most ``maximum_iterations``).

    Args:
        condition: takes the carried values (never the infeed element); returns a bool.
        body: takes the carried values, then the infeed element (module docstring).
        inputs: the initial carried values: a list, a single value, or None (none).
        infeed_queue: an ``IPUInfeedQueue`` dequeued once per iteration, or None.
        maximum_iterations: an upper bound on the iterations (None: no bound).
        use_while_v1: accepted for TF compatibility; no effect.

    Returns:
        The final carried values: one bare, several as a list, none as an Operation.

    Raises:
        TypeError: ``body`` or ``condition`` cannot take the inputs (TF's message), or the
            body's output dtypes differ from the inputs'.
        ValueError: the body returns Operations before tensors; ``maximum_iterations`` < 0.
        OutOfRangeError: the infeed's dataset ran out (from the infeed).
    """
    carried = [to_tensor(x) for x in ([] if inputs is None else _as_list(inputs))]
    check_arity("body", body, carried, infeed_queue)
    check_arity("condition", condition, carried, None)
    if maximum_iterations is not None and (not isinstance(maximum_iterations, (int, np.integer))
                                           or maximum_iterations < 0):
        raise ValueError(f"maximum_iterations must be None or >= 0, got {maximum_iterations!r}")
    return _run("while_loop", condition, body, carried, infeed_queue, maximum_iterations)


def repeat(n: int, body: Callable[..., Any], inputs: Any = None, infeed_queue: Any = None,
           use_while_v1: bool = True) -> Any:
    """Run ``body`` exactly ``n`` times (:func:`while_loop` with a true condition).

    Raises:
        ValueError: ``n`` is not an integer >= 0; see :func:`while_loop` for the rest.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"loops.repeat needs an integer n >= 0, got {n!r}")
    carried = [to_tensor(x) for x in ([] if inputs is None else _as_list(inputs))]
    check_arity("body", body, carried, infeed_queue)
    return _run("repeat", lambda *_: True, body, carried, infeed_queue, int(n))


def _run(kind: str, condition, body, carried: list, infeed_queue, limit: int | None) -> Any:
    input_types = _dtypes(carried)
    arity = len(carried)
    with frame(kind, limit) as info:
        while limit is None or info.iteration < limit:
            if not condition(*carried):
                break
            args, kwargs = ([], {}) if infeed_queue is None else \
                body_arguments(infeed_queue.next_element())
            carried = _split_outputs(body(*carried, *args, **kwargs), input_types)
            info.iteration += 1
    if arity == 0:
        return Operation(kind)
    return carried[0] if arity == 1 else carried
