"""The bridge between TF ops and ipupod's replicas: a TF op that calls an ipupod collective
must know which replica it runs for, and TensorFlow runs a ``numpy_function`` on threads of
its own (its inter-op pool), not in the replica's thread.

A replica function runs inside :func:`replica_function`'s wrapper: a ``tf.function`` whose
first argument is the local replica index as an int32 scalar tensor. While it is traced, that
tensor is this thread's *index tensor* (:func:`index_tensor`); every bridged op
(:func:`call`) passes it to its ``numpy_function``, which enters that replica's context
(``ipu_node.runtime.replica.entered_replica_context``) on TF's thread and calls the
collective there. One trace serves every local replica. Outside a trace (eager code in a
replica thread) the index is the thread's own replica's.

**Program order.** Every replica must call its collectives in the same order (GCL's
sequence numbers), but a traced function runs its ops as their inputs allow, several at a
time. TF's automatic control dependencies chain the stateful ops that take no resource in
program order, and the ops that take a resource by resource only: a ``tf.cond`` or loop whose
branch reads a variable, with a collective inside, then ran beside the collective before it,
in a different order on different replicas (replicas disagreed on ``cross_replica_sum #n``).
So, in a trace, every bridged op also takes one resource, the *order token* (a variable of
its own, never read): to the automatic control dependencies every bridged op writes it, and
so does every branch or loop that holds one, which chains them all in program order.

Used by ``cross_replica_ops``, ``all_to_all_op``, ``reduce_scatter_op``, ``replication_ops``,
the feeds and the Horovod modules on TF tensors.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from ipu_node import current_replica_context, get_system, require_replica_context
from ipu_node.runtime.replica import entered_replica_context

__all__ = ["index_tensor", "has_index_tensor", "replica_function", "call", "call_eager",
           "local_index_scope", "take_error", "ordered_numpy_function", "call_unwrapped"]

_tracing = threading.local()
#: the exception a bridged op raised, by local replica index, until :func:`take_error`
#: (TensorFlow turns it into an ``UnknownError`` carrying its traceback as text)
_errors: dict[int, BaseException] = {}
_errors_lock = threading.Lock()
#: local index -> the context of the replica running a replica function with that index
_running: dict[int, Any] = {}
_running_lock = threading.Lock()


def take_error(local_index: int) -> BaseException | None:
    """The exception a bridged op of replica ``local_index`` raised, if any (and forget it):
    the strategy raises it in place of TensorFlow's wrapper."""
    with _errors_lock:
        return _errors.pop(local_index, None)


def call_unwrapped(local_index: int, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` (a traced function of replica ``local_index`` that may hold
    bridged ops), raising a bridged op's own exception in place of TensorFlow's wrapper."""
    take_error(local_index)
    try:
        return fn(*args, **kwargs)
    except tf.errors.OpError:
        original = take_error(local_index)   # (a collective's own error, unwrapped)
        if original is None:
            raise
        raise original from None


@contextlib.contextmanager
def local_index_scope(index: tf.Tensor):
    """Make ``index`` (the traced local replica index) this thread's index tensor."""
    previous = getattr(_tracing, "index", None)
    _tracing.index = index
    try:
        yield
    finally:
        _tracing.index = previous


def has_index_tensor() -> bool:
    """Whether a replica function is being traced in this thread (its index tensor set)."""
    return getattr(_tracing, "index", None) is not None and not tf.executing_eagerly()


def index_tensor(what: str) -> tf.Tensor:
    """The local replica index of the replica this op runs for (int32 scalar).

    Raises:
        NotInReplicaError: outside a replica function (names ``what``).
    """
    traced = getattr(_tracing, "index", None)
    if traced is not None and not tf.executing_eagerly():
        return traced
    return tf.constant(require_replica_context(what).local_index, tf.int32)


def replica_function(fn: Callable[..., Any],
                     context: Callable[[], Any] = contextlib.nullcontext) -> Callable[..., Any]:
    """``fn`` as ``g(local_index, *args, **kwargs)``: a ``tf.function`` (without XLA: a
    collective's ``PyFunc`` cannot be XLA-compiled on the CPU) of ``fn``'s Python function
    when ``fn`` is a ``tf.function`` (a returned ``tf.Operation`` becomes None; while it
    runs, its bridged ops enter the calling replica's context), else a Python function
    running ``fn`` eagerly; either way inside ``context()`` (e.g. the strategy's TF replica
    context, entered in the trace's graph)."""
    python_fn = getattr(fn, "python_function", None)
    if python_fn is None:
        def eager(local_index, *args, **kwargs):
            with context():
                return fn(*args, **kwargs)
        return eager

    def traced(local_index, *args, **kwargs):
        with local_index_scope(local_index), context():
            result = python_fn(*args, **kwargs)
        # an Operation returned (``return loops.repeat(...)`` without carried values) is
        # None, as TF 2.6's tf.function made it (it runs: the function's control outputs)
        return tf.nest.map_structure(
            lambda v: None if isinstance(v, tf.Operation) else v, result)
    function = tf.function(traced, autograph=getattr(fn, "_autograph", True))

    def run(local_index, *args, **kwargs):
        ctx = current_replica_context()
        if ctx is None:
            return function(local_index, *args, **kwargs)
        with _running_as(ctx):
            return function(local_index, *args, **kwargs)
    return run


_order_lock = threading.Lock()
_order: list = []


def _order_token() -> tf.Tensor:
    """The handle of the order token (module docstring), made once per process."""
    with _order_lock:
        if not _order:
            from tensorflow.python.ops import resource_variable_ops
            with tf.init_scope():   # (not through variable creators: no strategy's copies)
                _order.append(resource_variable_ops.ResourceVariable(
                    0, dtype=tf.int32, trainable=False, name="ipupod_collective_order"))
    return _order[0].handle


def ordered_numpy_function(fn: Callable[..., Any], inputs: Sequence[tf.Tensor], out_dtypes,
                           name: str):
    """``tf.numpy_function(fn, inputs, out_dtypes, stateful=True, name=name)`` that, in a
    trace, also takes the order token (module docstring: program order among every such op,
    also across branches and loops); ``fn`` gets ``inputs`` only."""
    args, skip = _ordered(inputs)
    return tf.numpy_function(lambda *arrays: fn(*arrays[skip:]), args, out_dtypes,
                             stateful=True, name=name)


def _ordered(inputs: Sequence[tf.Tensor]) -> tuple[list, int]:
    """``(inputs with the order token first in a trace, how many inputs that added)``."""
    if tf.executing_eagerly():
        return list(inputs), 0
    return [_order_token(), *inputs], 1


def _context_of(local_index: int):
    mine = current_replica_context()
    if mine is not None and mine.local_index == local_index:
        return contextlib.nullcontext(mine)
    with _running_lock:
        running = _running.get(int(local_index))
    return entered_replica_context(running or get_system().replica_context(int(local_index)))


@contextlib.contextmanager
def _running_as(ctx):
    """While a replica function runs: ops run for local index ``ctx.local_index`` enter
    ``ctx`` (not always the system's: ``ipu_compiler.compile``'s unreplicated replica holds
    every IPU of the device)."""
    index = ctx.local_index
    with _running_lock:
        previous = _running.get(index)
        _running[index] = ctx
    try:
        yield
    finally:
        with _running_lock:
            if previous is None:
                _running.pop(index, None)
            else:
                _running[index] = previous


def _recorded(local_index: int, fn: Callable[..., Any], *args):
    """``fn(*args)`` in replica ``local_index``'s context; an exception it raises is kept for
    :func:`take_error` (TensorFlow wraps it)."""
    try:
        with _context_of(int(local_index)):
            return fn(*args)
    except BaseException as exc:
        with _errors_lock:
            _errors.setdefault(int(local_index), exc)
        raise


def call_eager(fn: Callable[..., Any], inputs: Sequence[tf.Tensor], what: str):
    """``fn(*tensors)`` (eager TF tensors in, nothing out) as one stateful TF op
    (``tf.py_function``: ``fn`` runs eagerly, may run TF ops, create variables and call
    collectives), run in the context of the replica the op runs for; in eager code it is
    called at once.

    Returns:
        The op (a ``tf.Operation``) in a ``tf.function``; None in eager code.

    Raises:
        NotInReplicaError: outside a replica function (names ``what``).
    """
    index = index_tensor(what)
    if tf.executing_eagerly():
        _recorded(int(index), fn, *inputs)
        return None

    args, skip = _ordered([index, *inputs])

    def in_replica(*tensors):
        local_index, *tensors = tensors[skip:]
        _recorded(int(local_index), fn, *tensors)
        return tf.constant(0, tf.int32)

    done = tf.py_function(in_replica, args, [tf.int32], name=what.replace(" ", "_"))
    return (done[0] if isinstance(done, (list, tuple)) else done).op


def call(fn: Callable[..., Any], inputs: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
         out_shapes: Sequence[tf.TensorShape], what: str) -> list[tf.Tensor]:
    """``fn(*arrays)`` (numpy in, numpy out, a list of one array per output) as one TF op,
    run in the context of the replica the op runs for.

    Raises:
        NotInReplicaError: outside a replica function (names ``what``).
    """
    index = index_tensor(what)

    def in_replica(local_index, *arrays):
        out = _recorded(local_index, fn, *arrays)
        return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(out, out_dtypes)]

    results = ordered_numpy_function(in_replica, [index, *inputs], list(out_dtypes),
                                     name=what.replace(" ", "_"))
    if not isinstance(results, (list, tuple)):   # (eager: one output comes back bare)
        results = [results]
    for tensor, shape in zip(results, out_shapes):
        tensor.set_shape(shape)
    return list(results)
