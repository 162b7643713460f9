"""``tensorflow.python.ipu.ipu_outfeed_queue``: ``IPUOutfeedQueue`` on TF tensors (TFI
``ipu/ipu_outfeed_queue.py:79-541``; reference tf-keras-ipu.md §6.2, oracle 20).

The queue is ipu_node's :class:`ipu_node.ipu_outfeed_queue.IPUOutfeedQueue` (the semantics
once: per-replica storage in local order, the ALL / LAST shapes ``[n, R, *s]`` / ``[R, *s]``
with the R dimension only when R > 1, draining dequeues, the structure and shape checks).
This module converts at its boundary: in a ``tf.function`` an ``enqueue`` is one TF op
(:mod:`ipu_tensorflow._bridge`) that hands the replica's numpy values to that queue, and
``dequeue`` turns the queue's numpy values into TF tensors.

R is the number of this instance's replicas (under poprun each instance dequeues its own).
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator

import numpy as np
import tensorflow as tf
from ipu_node import ipu_outfeed_queue as _np
from ipu_node.ipu_outfeed_queue import IPUOutfeedMode

from ipu_tensorflow import _bridge

__all__ = ["IPUOutfeedMode", "IPUOutfeedQueue"]


def _as_tensors(value: Any) -> Any:
    return tf.nest.map_structure(tf.convert_to_tensor, value)


class IPUOutfeedQueue:
    """Collects tensors the replicas enqueue, for the host to dequeue.

    Args:
        outfeed_mode: ``IPUOutfeedMode.ALL`` (default: every enqueued value) or ``LAST``.
        device_ordinal: the IPU device (default 0); recorded.
        buffer_depth: Poplar's buffer depth, >= 1 (default 3); recorded.
        optimise_latency: accepted (no modelled effect).

    SDK 2.x's ``feed_name``, ``replication_factor`` and ``io_batch_size`` [004:274] are a
    TypeError, as in TF-IPU 3.x (reference §6.2).

    Raises:
        ValueError: ``outfeed_mode`` is not an IPUOutfeedMode; ``buffer_depth`` < 1.
    """

    def __init__(self, outfeed_mode: IPUOutfeedMode | None = None,
                 device_ordinal: int | None = None, buffer_depth: int = 3,
                 optimise_latency: bool = False):
        if isinstance(buffer_depth, bool) or not isinstance(buffer_depth, (int, np.integer)) \
                or buffer_depth < 1:
            raise ValueError(f"IPUOutfeedQueue: buffer_depth must be an integer >= 1, got "
                             f"{buffer_depth!r}")
        self._queue = _np.IPUOutfeedQueue(outfeed_mode,
                                          0 if device_ordinal is None else device_ordinal)
        self._buffer_depth = int(buffer_depth)
        self._optimise_latency = bool(optimise_latency)
        self._graphs: weakref.WeakSet = weakref.WeakSet()   # graphs that enqueue

    @property
    def outfeed_mode(self) -> IPUOutfeedMode:
        """ALL or LAST."""
        return self._queue.outfeed_mode

    @property
    def enqueued(self) -> bool:
        """Whether an ``enqueue`` was built (traced) or run."""
        return len(self._graphs) > 0 or self._queue.enqueued

    @property
    def deleter(self):
        """Drops every queued value."""
        return self._queue.deleter

    def note_enqueue_built(self) -> None:
        """Record an enqueue built in the current graph (by :meth:`enqueue`, or by a
        pipeline op that enqueues when it runs); no-op in eager code.

        Raises:
            ValueError: a second one in the same graph ("An outfeed can only be enqueued
                once.", TFI ``:217-218``).
        """
        if tf.executing_eagerly():
            return
        graph = tf.compat.v1.get_default_graph()   # (a loop body's own graph)
        if graph in self._graphs:
            raise ValueError("An outfeed can only be enqueued once.")
        self._graphs.add(graph)

    def enqueue(self, tensors: Any):
        """Queue ``tensors`` (a tensor, or a list/tuple/dict nest of tensors, dict keys
        strings) of the replica this op runs for.

        Returns:
            The enqueue's ``tf.Operation`` in a ``tf.function`` (a loop body returns it after
            its tensors); None in eager code (run at once).

        Raises:
            ValueError: a second enqueue in the same function ("An outfeed can only be
                enqueued once.", TFI ``:217-218``); when the op runs (re-raised by
                ``strategy.run``): a structure, shape or dtype other than the first's, dict
                keys that are not strings.
            NotInReplicaError: outside a replica function.
        """
        self.note_enqueue_built()
        leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(tensors)]

        def push(*arrays):
            self._queue.enqueue(tf.nest.pack_sequence_as(tensors, list(arrays)))
            return [np.int32(0)]

        done = _bridge.call(push, leaves, [tf.int32], [tf.TensorShape([])],
                            f"IPUOutfeedQueue {self._queue.feed_name} enqueue")[0]
        return None if tf.executing_eagerly() else done.op

    def dequeue(self, wait_for_completion: bool = False) -> Any:
        """The queued values as TF tensors, draining the queue (eager, on the host).

        Shapes, for a value of shape ``s`` enqueued ``n`` times by each of R local
        replicas (seed 004; oracle 20): ALL ``[n, R, *s]`` (``[n, *s]`` when R = 1), LAST
        ``[R, *s]`` (``s`` when R = 1); the enqueued nest's structure is kept.

        Raises:
            ValueError: nothing was ever enqueued ("Trying to dequeue an outfeed which has
                not been enqueued."); called inside a ``tf.function``.
            FailedPreconditionError: LAST with no value since the last dequeue.
        """
        if not tf.executing_eagerly():
            raise ValueError("IPUOutfeedQueue.dequeue runs on the host: call it outside the "
                             "tf.function (after strategy.run returns)")
        return _as_tensors(self._queue.dequeue(wait_for_completion))

    def __iter__(self) -> Iterator[Any]:
        """One element per enqueue (``[R, *s]``, or ``s`` when R = 1), oldest first,
        draining the queue; eager and ALL mode only (TFI ``:472-541``).

        Raises:
            RuntimeError: inside a ``tf.function``, or in LAST mode.
        """
        if not tf.executing_eagerly():
            raise RuntimeError("Iterating an IPUOutfeedQueue is only supported in eager mode.")
        if self.outfeed_mode is not IPUOutfeedMode.ALL:
            raise RuntimeError("Iterating an IPUOutfeedQueue is only supported with "
                               "IPUOutfeedMode.ALL.")
        for value in self._queue:
            yield _as_tensors(value)

    def __repr__(self) -> str:
        return f"IPUOutfeedQueue({self._queue.feed_name!r}, outfeed_mode={self.outfeed_mode})"
