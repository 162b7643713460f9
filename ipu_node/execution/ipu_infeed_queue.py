"""``IPUInfeedQueue``: a dataset fed to the replicas' loops [004:151-260].

Distribution over replicas (how TF-IPU's host fills the queues, replica by replica
[PE:983-1011]): global replica ``r`` of ``R`` gets element ``i*R + r`` of the dataset at its
``i``-th dequeue. Iteration counts start at 0 when the queue is made and carry on across
``compile`` calls (the dataset iterator lives as long as the queue, as in TF).

* Several local replicas run in threads at once; the queue hands out elements under a lock,
  by index, so which replica gets which element never depends on thread timing.
* Several instances (poprun): every instance iterates the *same* dataset from its start and
  each local replica takes the elements of its global index; the elements of other instances'
  replicas are read and dropped. The result is layout-invariant: 1x4 and 2x2 feed every global
  replica the same elements. (A dataset that shuffles must therefore use a seed.) To give each
  instance only its share, ``shard`` the dataset by instance instead, as with popdist.
* Outside replica functions the caller is replica 0 of 1.

Eager emulation: the ``initializer`` and ``deleter`` properties act when read (TF2 eager
does the same); reading ``initializer`` is optional (the first dequeue starts the iterator),
but it may be read only once, as in TF.
"""

from __future__ import annotations

import itertools
import threading
import warnings
from typing import Any

import numpy as np

from ipu_node import nest as _nest
from ipu_node.errors import InvalidArgumentError, OutOfRangeError
from ipu_node.execution.data import as_dataset
from ipu_node.execution.loops import body_arguments
from ipu_node.execution.operation import Operation
from ipu_node.runtime.replica import current_replica_context

__all__ = ["IPUInfeedQueue", "dequeued_bytes", "reset_dequeued_bytes"]

_DEPRECATED = {
    "feed_name": "No change needed. feed_name is now automatically generated.",
    "replication_factor": "No change needed. replication_factor is now set automatically "
                          "based on the model.",
    "data_to_prefetch": "Use prefetch_depth instead.",
}
_uids = itertools.count()
_END = object()
# feed name -> (bytes per element, {global replica index: elements dequeued}), every queue
# of this process (read by collectives.step_model.ModelCard.from_run)
_DEQUEUED: dict[str, tuple[int, dict[int, int]]] = {}
_DEQUEUED_LOCK = threading.Lock()


def dequeued_bytes() -> dict[str, tuple[int, dict[int, int]]]:
    """What the :class:`IPUInfeedQueue` s of this process fed so far (since the last
    :func:`reset_dequeued_bytes`): ``{feed_name: (bytes per element, {global replica index:
    elements dequeued})}``. Bytes are the element's components' ``nbytes`` as fed to the
    IPU (numpy arrays of the dataset's element spec); a copy, safe to keep."""
    with _DEQUEUED_LOCK:
        return {name: (nbytes, dict(counts)) for name, (nbytes, counts) in _DEQUEUED.items()}


def reset_dequeued_bytes() -> None:
    """Forgets what :func:`dequeued_bytes` reports (the queues themselves are unchanged)."""
    with _DEQUEUED_LOCK:
        _DEQUEUED.clear()


def check_deprecated(cls_name: str, deprecated: dict, allowed: dict) -> None:
    """Warn about each deprecated argument given; TypeError for an unknown one."""
    for name in deprecated:
        if name not in allowed:
            raise TypeError(f"{cls_name}() got an unexpected keyword argument {name!r}")
        warnings.warn(f"{cls_name}: argument {name!r} is deprecated: {allowed[name]}",
                      DeprecationWarning, stacklevel=3)


def check_device_ordinal(device_ordinal: Any) -> int:
    """``device_ordinal`` as an int; TypeError if not an integer (e.g. an old positional
    ``feed_name``), ValueError if negative."""
    if isinstance(device_ordinal, bool) or not isinstance(device_ordinal, (int, np.integer)):
        raise TypeError(f"device_ordinal must be an integer, got {device_ordinal!r} (pass "
                        "deprecated arguments such as feed_name by keyword)")
    if device_ordinal < 0:
        raise ValueError(f"device_ordinal must be >= 0, got {device_ordinal}")
    return int(device_ordinal)


class IPUInfeedQueue:
    """Feeds a dataset's elements to the replicas, one element per replica per iteration.

    Args:
        dataset: an :class:`ipu_node.data.Dataset` or any iterable of fixed-shape numpy
            nests; every transformation (batch, repeat, ...) applied before. The queue reads
            it from its start.
        device_ordinal: the TF device the queue serves (``/device:IPU:<ordinal>``); recorded.
        prefetch_depth: Poplar's datastream buffer depth, 1..255 (default: 1); recorded, it
            does not change what is fed.
        **deprecated: ``feed_name`` (used in error messages when given),
            ``replication_factor`` (ignored: the replica context tells), ``data_to_prefetch``
            (ignored); each warns (DeprecationWarning), as TF-IPU does.

    Raises:
        ValueError: a dimension of the element spec is unknown, with TF-IPU's message
            ("... If using tf.Dataset.batch, set `drop_remainder=True`."); a bad
            ``prefetch_depth``.
        InvalidArgumentError: an element has a dimension of size 0.
        TypeError: an unknown keyword argument, or a non-integer ``device_ordinal``.
    """

    def __init__(self, dataset: Any, device_ordinal: int = 0, prefetch_depth: int | None = None,
                 **deprecated: Any):
        check_deprecated("IPUInfeedQueue", deprecated, _DEPRECATED)
        self._device_ordinal = check_device_ordinal(device_ordinal)
        if prefetch_depth is None:
            prefetch_depth = 1
        if prefetch_depth <= 0:
            raise ValueError(f"prefetch_depth must be greater than zero, but it is "
                             f"{prefetch_depth}")
        if prefetch_depth > 255:
            raise ValueError(f"prefetch_depth must be less than 256, but it is {prefetch_depth}")
        self._prefetch_depth = prefetch_depth
        self._dataset = as_dataset(dataset)
        self._structure = self._dataset.element_spec
        self._flat_specs, self._treedef = _nest.flatten(self._structure)
        for spec in self._flat_specs:
            if not spec.is_fully_defined():
                raise ValueError(f"Output shape {spec.shape} is not fully defined. If using "
                                 "tf.Dataset.batch, set `drop_remainder=True`.")
            if 0 in spec.shape:
                raise InvalidArgumentError(
                    "Detected an input tensor to an infeed queue with a dimension of size 0. "
                    "Please remove it from the inputs.")
        name = deprecated.get("feed_name")
        self._feed_name = str(name) if name is not None else f"infeed{next(_uids)}"
        self._lock = threading.Lock()
        self._iterator = None
        self._initialized = False
        self._deleted = False
        self._dequeued = False
        self._pulled = 0           # elements read from the dataset so far
        self._exhausted = False
        self._buffer: dict[int, Any] = {}      # element index -> element, for local replicas
        self._iterations: dict[int, int] = {}  # global replica index -> dequeues so far
        self._num_replicas: int | None = None

    @property
    def feed_name(self) -> str:
        """The name in error messages: ``feed_name`` if given, else ``infeed<N>``."""
        return self._feed_name

    @property
    def initializer(self) -> Operation:
        """Starts the dataset iterator (TF: an op to run once before the loop).

        Raises:
            ValueError: read a second time (TF-IPU's message).
        """
        with self._lock:
            if self._initialized:
                raise ValueError(
                    "The IPUInfeedQueue `initializer` function can only be accessed once.")
            self._initialized = True
            self._start()
        return Operation(f"{self._feed_name}/initializer")

    @property
    def deleter(self) -> Operation:
        """Drops the iterator and its buffered elements; the queue cannot be dequeued after."""
        with self._lock:
            self._deleted = True
            self._iterator = None
            self._buffer.clear()
        return Operation(f"{self._feed_name}/deleter")

    @property
    def dequeued(self) -> bool:
        """Whether a loop has dequeued from this queue."""
        return self._dequeued

    @property
    def number_of_tuple_elements(self) -> int:
        """How many arguments an element adds to a loop body (a dict element: one per key)."""
        args, kwargs = body_arguments(self._structure)
        return len(args) + len(kwargs)

    @property
    def element_spec(self) -> Any:
        """The dataset's element spec (a nest of ``TensorSpec``)."""
        return self._structure

    @property
    def element_nbytes(self) -> int:
        """Bytes of one element (every component's shape times its dtype's itemsize): what
        one dequeue moves from the host to a replica."""
        return sum(int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
                   for spec in self._flat_specs)

    def get_next(self) -> None:
        """Obsolete (TF-IPU): loops dequeue the queue.

        Raises:
            ValueError: always.
        """
        raise ValueError("`get_next()` is now obsolete as the IPUInfeedQueue is now "
                         "automatically dequeued by the loop.")

    def _start(self) -> None:
        if self._iterator is None and not self._exhausted:
            self._iterator = iter(self._dataset)

    def next_element(self) -> Any:
        """The calling replica's next element (loops call this once per iteration; front
        ends' loops too, converting it at their boundary).

        Raises:
            OutOfRangeError: the dataset has no element left for this replica (names the feed,
                the replica and the iteration).
            ValueError: the queue was deleted; the number of replicas changed between
                dequeues; an element does not match the spec of the first.
        """
        ctx = current_replica_context()
        if ctx is None:
            replica, num_replicas, first_local, num_local = 0, 1, 0, 1
        else:
            replica, num_replicas = ctx.replica_index, ctx.num_replicas
            first_local, num_local = ctx.replica_index - ctx.local_index, ctx.num_local_replicas
        with self._lock:
            if self._deleted:
                raise ValueError(f"IPUInfeedQueue {self._feed_name!r} was deleted (its deleter "
                                 "was read); make a new queue")
            if self._num_replicas is None:
                self._num_replicas = num_replicas
            elif self._num_replicas != num_replicas:
                raise ValueError(
                    f"IPUInfeedQueue {self._feed_name!r} was first dequeued by "
                    f"{self._num_replicas} replica(s), now by {num_replicas}: a queue serves "
                    "one replication factor")
            self._start()
            iteration = self._iterations.get(replica, 0)
            index = iteration * num_replicas + replica
            while self._pulled <= index:
                element = _END if self._exhausted else next(self._iterator, _END)
                if element is _END:
                    self._exhausted, self._iterator = True, None
                    raise OutOfRangeError(
                        f"IPUInfeedQueue {self._feed_name!r} ran out of data: replica "
                        f"{replica} of {num_replicas} needs element {index} at iteration "
                        f"{iteration}, but the dataset ended after {self._pulled} elements "
                        "(on the IPU, running a loop for more iterations than the dataset "
                        "has elements left is a fatal error [004:2552]; repeat() the dataset "
                        "or run fewer iterations)")
                k, self._pulled = self._pulled, self._pulled + 1
                if first_local <= k % num_replicas < first_local + num_local:
                    self._buffer[k] = self._checked(element, k)
            self._iterations[replica] = iteration + 1
            self._dequeued = True
            element = self._buffer.pop(index)
        with _DEQUEUED_LOCK:
            counts = _DEQUEUED.setdefault(self._feed_name, (self.element_nbytes, {}))[1]
            counts[replica] = counts.get(replica, 0) + 1
        return element

    def _checked(self, element: Any, index: int) -> Any:
        leaves, treedef = _nest.flatten(element)
        if treedef != self._treedef:
            raise ValueError(
                f"IPUInfeedQueue {self._feed_name!r}: element {index} has the structure "
                f"{_nest.describe(treedef)}, the dataset's is {_nest.describe(self._treedef)}")
        for c, (leaf, spec) in enumerate(zip(leaves, self._flat_specs)):
            arr = np.asarray(leaf)
            if arr.shape != spec.shape or arr.dtype != spec.dtype:
                raise ValueError(
                    f"IPUInfeedQueue {self._feed_name!r}: element {index}, component {c} has "
                    f"shape {arr.shape} and dtype {arr.dtype}; the dataset's are {spec.shape} "
                    f"and {spec.dtype} (feeds need fixed shapes)")
        return element

    def __repr__(self) -> str:
        return f"IPUInfeedQueue({self._feed_name!r}, element_spec={self._structure!r})"
