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

import threading
from typing import Any

import numpy as np
import tensorflow as tf
from ipu_node import ipu_infeed_queue as _np
from ipu_node.data import Dataset as _NumpyDataset, TensorSpec as _NumpySpec

from ipu_node import current_replica_context

from ipu_tensorflow import _bridge

__all__ = ["IPUInfeedQueue", "IPUOwnedIterator", "install_dataset_iterators"]


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
        """Whether a loop has dequeued from this queue (or built a dequeue in a
        ``tf.function``, as TF-IPU counts it)."""
        return getattr(self, "_built", False) or self._queue.dequeued

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

        if not tf.executing_eagerly():
            self._built = True          # (TF-IPU: a dequeue built counts as dequeued)
        tensors = _bridge.call(pull, [], [s.dtype for s in specs], [s.shape for s in specs],
                               f"IPUInfeedQueue {self.feed_name} dequeue")
        return tf.nest.pack_sequence_as(self._structure, tensors)

    def next_numpy_element(self) -> Any:
        """The calling replica's next element as numpy (a nest), read now: what a
        pipeline's op dequeues when it runs (the replica's context entered)."""
        return self._queue.next_element()

    def __repr__(self) -> str:
        return f"IPUInfeedQueue({self.feed_name!r}, element_spec={self._structure!r})"


class IPUOwnedIterator:
    """What ``iter(dataset)`` gives in eager code under an ``IPUStrategy`` scope (TFI
    ``dataset_ops.py:412-417``, ``ipu/keras_extensions.py:52-57``; reference tf-keras-ipu.md
    §3.1, §6.1): an infeed. ``next(iterator)`` in a replica function (``strategy.run``, one
    TF op in its ``tf.function``) gives each replica its own element, global replica ``r``
    of ``R`` element ``i*R + r`` at its ``i``-th ``next`` (an :class:`IPUInfeedQueue` made at
    the first such ``next``: fixed shapes required, its errors). It can also be given as
    ``infeed_queue`` to ``loops.repeat`` and ``pipelining_ops.pipeline``.

    On the host (outside a replica) ``next`` reads the dataset as TensorFlow's own iterator
    does, from its start, apart from the replicas' reads (ipupod: Keras and user code that
    peeks at a batch under the scope keep working).

    Args:
        dataset: the ``tf.data.Dataset``.

    Raises (at the first replica ``next``):
        ValueError: a shape not fully defined (the infeed's message).
        ipu_node.errors.OutOfRangeError: the dataset has no element left for the replica.
    """

    def __init__(self, dataset: tf.data.Dataset):
        self._dataset = dataset
        self._infeed: IPUInfeedQueue | None = None
        self._host = None

    def _feed(self) -> IPUInfeedQueue:
        with _FEED_LOCK:
            if self._infeed is None:
                with tf.init_scope():    # (first used in a trace: made on the host)
                    self._infeed = IPUInfeedQueue(self._dataset)
            return self._infeed

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def __iter__(self) -> "IPUOwnedIterator":
        return self

    def __next__(self) -> Any:
        if current_replica_context() is None and not _bridge.has_index_tensor():
            if self._host is None:
                self._host = _ORIGINAL_ITER[0](self._dataset)
            return next(self._host)
        return self._feed().next_element()

    def get_next(self) -> Any:
        """``next(self)``."""
        return self.__next__()

    # -- the infeed protocol (loops.repeat, pipelining_ops.pipeline) ----------------------------
    def next_element(self) -> Any:
        return self._feed().next_element()

    def next_numpy_element(self) -> Any:
        return self._feed().next_numpy_element()

    @property
    def number_of_tuple_elements(self) -> int:
        return self._feed().number_of_tuple_elements

    @property
    def dequeued(self) -> bool:
        return self._infeed is not None and self._infeed.dequeued

    def __repr__(self) -> str:
        return f"IPUOwnedIterator(element_spec={self.element_spec!r})"


_ORIGINAL_ITER: list = []
_FEED_LOCK = threading.Lock()


def _iterators_strategy():
    """The strategy in scope when it asks for infeed iterators (``IPUStrategyV1``'s
    ``enable_dataset_iterators``), else None."""
    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    return strategy if getattr(strategy, "_enable_dataset_iterators", False) else None


def install_dataset_iterators() -> None:
    """Make ``iter(dataset)`` in eager code under an ``IPUStrategy`` scope an
    :class:`IPUOwnedIterator` (once per process; importing ``tensorflow.python.ipu`` does).
    Everywhere else, and inside ``tf.function``s, it is TensorFlow's own iterator."""
    if _ORIGINAL_ITER:
        return
    dataset_class = tf.data.Dataset
    original = dataset_class.__iter__
    _ORIGINAL_ITER.append(original)

    def __iter__(self):
        if tf.executing_eagerly() and current_replica_context() is None and \
                _iterators_strategy() is not None:
            return IPUOwnedIterator(self)
        return original(self)

    dataset_class.__iter__ = __iter__
