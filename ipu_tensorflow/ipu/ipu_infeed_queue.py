"""``tensorflow.python.ipu.ipu_infeed_queue``: ``IPUInfeedQueue`` on a ``tf.data.Dataset``
(TFI ``ipu/ipu_infeed_queue.py:106-207``; reference tf-keras-ipu.md §6.1).

The queue is ipu_node's :class:`ipu_node.ipu_infeed_queue.IPUInfeedQueue` (the semantics
once: global replica ``r`` of ``R`` gets element ``i*R + r`` at its ``i``-th dequeue, every
instance reading the same dataset from its start, so the assignment does not depend on the
layout; the run-out, structure and shape errors; the byte counts of ``ModelCard.from_run``)
over the dataset's numpy elements (``as_numpy_iterator``). At its boundary this module turns
the TF element spec into ipu_node's and each dequeued element into TF tensors: in a
``tf.function`` a dequeue is one TF op (:mod:`ipu_tensorflow._bridge`) run for the replica
the function runs for, so one trace serves every replica.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from ipu_node import ipu_infeed_queue as _np
from ipu_node.data import Dataset as _NumpyDataset, TensorSpec as _NumpySpec

from ipu_tensorflow import _bridge

__all__ = ["IPUInfeedQueue"]


def _numpy_spec(spec: tf.TensorSpec) -> _NumpySpec:
    return _NumpySpec(tuple(spec.shape.as_list()), np.dtype(spec.dtype.as_numpy_dtype))


class IPUInfeedQueue:
    """Feeds a ``tf.data.Dataset`` to the replicas' loops, one element per replica per
    iteration (``loops.repeat(n, body, inputs, infeed_queue)``).

    Args:
        dataset: a ``tf.data.Dataset`` of fixed-shape dense tensors (``batch(...,
            drop_remainder=True)``); read from its start, on the host, as numpy.
        device_ordinal: the IPU device (``/device:IPU:<ordinal>``, default 0); recorded.
        prefetch_depth: Poplar's buffer depth, 1..255 (default 3, TF-IPU 3.x); recorded.
        optimise_latency: accepted (no modelled effect).
        **kwargs: SDK 2.x's ``feed_name``, ``replication_factor`` (ignored: the replica
            context tells) and ``data_to_prefetch`` [004:151], each warning
            (DeprecationWarning); any other keyword is a TypeError.

    Raises:
        TypeError: ``dataset`` is not a ``tf.data.Dataset``; a component is not a dense
            tensor; an unknown keyword.
        ValueError: a shape is not fully defined (TF-IPU's "Output shape S is not fully
            defined. If using tf.Dataset.batch, set `drop_remainder=True`."); a bad
            ``prefetch_depth``.
    """

    def __init__(self, dataset: tf.data.Dataset, device_ordinal: int | None = None,
                 prefetch_depth: int | None = None, optimise_latency: bool = False,
                 **kwargs: Any):
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"IPUInfeedQueue: dataset must be a tf.data.Dataset, not "
                            f"{type(dataset).__name__}")
        structure = dataset.element_spec
        for spec in tf.nest.flatten(structure):
            if not isinstance(spec, tf.TensorSpec):
                raise TypeError(f"IPUInfeedQueue: the dataset has a {type(spec).__name__} "
                                "component; infeeds take dense tensors only")
            if not spec.shape.is_fully_defined():
                raise ValueError(f"Output shape {spec.shape} is not fully defined. If using "
                                 "tf.Dataset.batch, set `drop_remainder=True`.")
        self._dataset = dataset
        self._structure = structure
        cardinality = int(dataset.cardinality())
        numpy_dataset = _NumpyDataset(dataset.as_numpy_iterator,
                                      lambda: tf.nest.map_structure(_numpy_spec, structure),
                                      cardinality)
        self._queue = _np.IPUInfeedQueue(
            numpy_dataset, 0 if device_ordinal is None else device_ordinal,
            3 if prefetch_depth is None else prefetch_depth, **kwargs)
        self._optimise_latency = bool(optimise_latency)

    @property
    def feed_name(self) -> str:
        """The name in error messages (``feed_name`` if given, else ``infeed<N>``)."""
        return self._queue.feed_name

    @property
    def element_spec(self) -> Any:
        """The dataset's element spec (a nest of ``tf.TensorSpec``)."""
        return self._structure

    @property
    def number_of_tuple_elements(self) -> int:
        """How many arguments an element adds to a loop body (a dict: one per key)."""
        return self._queue.number_of_tuple_elements

    @property
    def dequeued(self) -> bool:
        """Whether a loop has dequeued from this queue."""
        return self._queue.dequeued

    @property
    def initializer(self):
        """Starts the iterator (optional in TF2: the first dequeue starts it).

        Raises:
            ValueError: read a second time (TF-IPU's message).
        """
        return self._queue.initializer

    @property
    def deleter(self):
        """Drops the iterator; the queue cannot be dequeued after."""
        return self._queue.deleter

    def get_next(self):
        """Obsolete (TF-IPU).

        Raises:
            ValueError: always ("`get_next()` is now obsolete ...").
        """
        return self._queue.get_next()

    def next_element(self) -> Any:
        """The next element of the replica this op runs for, as TF tensors of the element
        spec (a nest): one TF op in a ``tf.function``, an eager read in a replica thread.

        Raises (when the op runs; ``strategy.run`` re-raises them unwrapped):
            ipu_node.errors.OutOfRangeError: the dataset has no element left for the
                replica (names the feed, the replica and the iteration).
            NotInReplicaError: outside a replica function.
        """
        specs = tf.nest.flatten(self._structure)

        def pull():
            return [np.asarray(leaf) for leaf in tf.nest.flatten(self._queue.next_element())]

        tensors = _bridge.call(pull, [], [s.dtype for s in specs], [s.shape for s in specs],
                               f"IPUInfeedQueue {self.feed_name} dequeue")
        return tf.nest.pack_sequence_as(self._structure, tensors)

    def __repr__(self) -> str:
        return f"IPUInfeedQueue({self.feed_name!r}, element_spec={self._structure!r})"
