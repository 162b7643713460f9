"""A small stand-in for ``tf.data.Dataset``: fixed-shape numpy nested structures.

An element is a nest of tuples, lists and dicts whose leaves are numpy arrays or numpy
scalars. A :class:`Dataset` is lazy and re-iterable: every ``iter(dataset)`` starts from the
first element (as a fresh ``tf.data`` iterator does). Transformations return new datasets::

    ds = Dataset.from_tensor_slices((images, labels))     # element: (image, label)
    ds = ds.shuffle(1000, seed=1).repeat().batch(32, drop_remainder=True)
    ds.element_spec  # (TensorSpec(shape=(32, 8, 8), dtype=float32), TensorSpec(shape=(32,), ...))

Any other iterable of fixed-shape numpy structures also works where a dataset is expected
(:func:`as_dataset` wraps it; its element spec comes from its first element).

Decisions where ``tf.data`` has no numpy counterpart:

* ``from_tensor_slices`` treats a list as one tensor (``np.asarray``), as TF converts lists to
  tensors; tuples and dicts are structure. A ``map`` function that returns a list gives a tuple.
* ``map`` learns its output spec by calling the function on the first input element (TF
  traces it); the function is therefore called once more than the elements require. When the
  input's batch dimension is unknown (``batch`` without ``drop_remainder``), every output leaf
  of rank >= 1 keeps an unknown leading dimension (ipupod rule: the batch dimension of a
  per-element function's output is the input's).
* ``shuffle`` follows tf.data's buffer algorithm (fill ``buffer_size`` elements, then emit a
  uniformly chosen buffered element and refill its slot from the input). With ``seed`` the
  order is deterministic: epoch ``e`` (the ``e``-th iteration of this shuffle, which is what
  ``repeat`` above it makes) draws from ``numpy.random.default_rng([seed, e])`` when
  ``reshuffle_each_iteration`` (the default), else every epoch uses ``[seed, 0]``. Without a
  seed the order differs between runs and between instances: give a seed when several
  instances must see the same dataset.
"""

from __future__ import annotations

import builtins
import itertools
import threading
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ipu_node import nest as _nest
from ipu_node.errors import InvalidArgumentError
from ipu_node.execution.elements import (TensorSpec, as_leaf, lists_to_arrays, spec_of,
                                         stack_elements)

__all__ = ["Dataset", "TensorSpec", "as_dataset", "INFINITE_CARDINALITY",
           "UNKNOWN_CARDINALITY"]

INFINITE_CARDINALITY = -1  #: ``tf.data.INFINITE_CARDINALITY``
UNKNOWN_CARDINALITY = -2   #: ``tf.data.UNKNOWN_CARDINALITY``


class Dataset:
    """A lazy, re-iterable sequence of fixed-shape numpy nested structures.

    Build one with :meth:`from_tensor_slices`, :meth:`from_tensors` or :meth:`range`; the
    constructor is internal.
    """

    def __init__(self, make_iter: Callable[[], Iterator], spec: Callable[[], Any],
                 cardinality: int):
        self._make_iter = make_iter
        self._spec_fn = spec
        self._spec: Any = None
        self._spec_lock = threading.Lock()
        self._cardinality = cardinality

    # ----- sources -----------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors: Any) -> "Dataset":
        """One element per index of the leaves' first dimension.

        Args:
            tensors: an array, or a tuple/dict nest of arrays (lists are arrays) that all have
                the same first dimension.

        Raises:
            ValueError: a leaf is a scalar, or the leaves' first dimensions differ.
        """
        leaves, treedef = _nest.flatten(lists_to_arrays(tensors))
        if not leaves:
            raise ValueError("from_tensor_slices needs at least one tensor")
        for i, leaf in enumerate(leaves):
            if leaf.ndim == 0:
                raise ValueError(f"from_tensor_slices: component {i} is a scalar; it has no "
                                 "dimension to slice")
        sizes = {leaf.shape[0] for leaf in leaves}
        if len(sizes) != 1:
            raise ValueError("from_tensor_slices: all components must have the same first "
                             f"dimension, got {[leaf.shape[0] for leaf in leaves]}")
        n = sizes.pop()

        def make_iter():
            for i in builtins.range(n):
                yield _nest.unflatten(treedef, [as_leaf(leaf[i]) for leaf in leaves])

        spec = _nest.unflatten(treedef, [TensorSpec(leaf.shape[1:], leaf.dtype)
                                         for leaf in leaves])
        return Dataset(make_iter, lambda: spec, n)

    @staticmethod
    def from_tensors(tensors: Any) -> "Dataset":
        """A dataset of exactly one element, ``tensors`` (lists are arrays)."""
        element = _nest.map_structure(as_leaf, lists_to_arrays(tensors))
        return Dataset(lambda: iter((element,)), lambda: spec_of(element), 1)

    @staticmethod
    def range(*args: int) -> "Dataset":
        """``Dataset.range(stop)`` / ``(start, stop[, step])``: int64 scalars, like ``range``."""
        r = builtins.range(*args)
        return Dataset(lambda: (np.int64(v) for v in r),
                       lambda: TensorSpec((), np.dtype(np.int64)), len(r))

    @staticmethod
    def zip(datasets: tuple) -> "Dataset":
        """Tuples of the elements of ``datasets`` (a tuple of datasets), until one ends."""
        parts = tuple(as_dataset(d) for d in datasets)
        cards = [p.cardinality() for p in parts]
        finite = [c for c in cards if c >= 0]
        card = (min(finite) if finite else
                UNKNOWN_CARDINALITY if UNKNOWN_CARDINALITY in cards else INFINITE_CARDINALITY)
        return Dataset(lambda: builtins.zip(*(iter(p) for p in parts)),
                       lambda: tuple(p.element_spec for p in parts), card)

    # ----- properties --------------------------------------------------------------------
    @property
    def element_spec(self) -> Any:
        """The nest of :class:`TensorSpec` of one element (computed once)."""
        with self._spec_lock:
            if self._spec is None:
                self._spec = self._spec_fn()
            return self._spec

    def cardinality(self) -> int:
        """Number of elements; ``INFINITE_CARDINALITY`` (-1) or ``UNKNOWN_CARDINALITY`` (-2)."""
        return self._cardinality

    def __iter__(self) -> Iterator:
        return iter(self._make_iter())

    def as_numpy_iterator(self) -> Iterator:
        """The elements (they are numpy already): ``iter(self)``."""
        return iter(self)

    def __repr__(self) -> str:
        return f"<Dataset element_spec={self.element_spec!r}>"

    # ----- transformations ---------------------------------------------------------------
    def batch(self, batch_size: int, drop_remainder: bool = False) -> "Dataset":
        """Stack ``batch_size`` consecutive elements leaf by leaf (a new first dimension).

        Without ``drop_remainder`` the last batch may be smaller, so the batch dimension is
        unknown (``None``) in :attr:`element_spec`, and an ``IPUInfeedQueue`` refuses the
        dataset, as TF-IPU does [004:224].

        Raises:
            ValueError: ``batch_size`` < 1.
            InvalidArgumentError: (when iterated) elements of one batch differ in shape.
        """
        n = _positive_int(batch_size, "batch_size")
        parent = self

        def make_iter():
            it = iter(parent)
            while True:
                chunk = list(itertools.islice(it, n))
                if not chunk or (drop_remainder and len(chunk) < n):
                    return
                yield stack_elements(chunk)

        def spec():
            first = None if not drop_remainder else n
            return _nest.map_structure(lambda s: TensorSpec((first, *s.shape), s.dtype),
                                       parent.element_spec)

        card = self._cardinality
        if card >= 0:
            card = card // n if drop_remainder else -(-card // n)
        return Dataset(make_iter, spec, card)

    def repeat(self, count: int | None = None) -> "Dataset":
        """The elements ``count`` times (``None`` or -1: for ever). An empty dataset stays
        empty (it never loops for ever looking for an element)."""
        if count is not None and (not isinstance(count, (int, np.integer)) or count < -1):
            raise ValueError(f"repeat count must be None, -1 or >= 0, got {count!r}")
        forever = count is None or count == -1
        parent = self

        def make_iter():
            epochs = itertools.count() if forever else builtins.range(count)
            for _ in epochs:
                empty = True
                for element in parent:
                    empty = False
                    yield element
                if empty:
                    return

        card = self._cardinality
        if card == 0 or (not forever and count == 0):
            card = 0
        elif forever:
            card = INFINITE_CARDINALITY if card != UNKNOWN_CARDINALITY else card
        elif card >= 0:
            card *= count
        return Dataset(make_iter, lambda: parent.element_spec, card)

    def map(self, map_func: Callable[..., Any]) -> "Dataset":
        """``map_func(*element)`` for a tuple element, else ``map_func(element)``.

        The output spec is taken from the function's result on the first element (see the
        module docstring). A returned list becomes a tuple.
        """
        parent = self

        def apply(element):
            out = map_func(*element) if isinstance(element, tuple) else map_func(element)
            if isinstance(out, list):
                out = tuple(out)
            return _nest.map_structure(as_leaf, out)

        def make_iter():
            return (apply(e) for e in parent)

        def spec():
            in_spec = parent.element_spec
            previous = getattr(_probe, "active", False)
            _probe.active = True  # a shuffle below does not count this pass as an epoch
            try:
                first = next(iter(parent), None)
            finally:
                _probe.active = previous
            if first is None:
                raise ValueError("cannot tell the element spec of map() over an empty dataset")
            out = spec_of(apply(first))
            unknown_batch = any(s.shape[:1] == (None,) for s in _nest.flatten(in_spec)[0])
            if unknown_batch:
                out = _nest.map_structure(
                    lambda s: TensorSpec((None, *s.shape[1:]) if s.shape else (), s.dtype), out)
            return out

        return Dataset(make_iter, spec, self._cardinality)

    def shuffle(self, buffer_size: int, seed: int | None = None,
                reshuffle_each_iteration: bool = True) -> "Dataset":
        """Randomly shuffled elements, with tf.data's buffer semantics (module docstring).

        Raises:
            ValueError: ``buffer_size`` < 1.
        """
        size = _positive_int(buffer_size, "buffer_size")
        base = np.random.SeedSequence().entropy if seed is None else int(seed)
        epochs = itertools.count()
        parent = self

        def make_iter():
            probing = getattr(_probe, "active", False)
            epoch = next(epochs) if reshuffle_each_iteration and not probing else 0
            rng = np.random.default_rng([base, epoch])
            it = iter(parent)
            buf = list(itertools.islice(it, size))
            while buf:
                j = int(rng.integers(len(buf)))
                out = buf[j]
                nxt = next(it, _END)
                if nxt is _END:
                    buf[j] = buf[-1]
                    buf.pop()
                else:
                    buf[j] = nxt
                yield out

        return Dataset(make_iter, lambda: parent.element_spec, self._cardinality)

    def take(self, count: int) -> "Dataset":
        """The first ``count`` elements (-1: all)."""
        if not isinstance(count, (int, np.integer)) or count < -1:
            raise ValueError(f"take count must be -1 or >= 0, got {count!r}")
        if count == -1:
            return self
        parent = self
        card = self._cardinality
        card = (min(card, count) if card >= 0 else
                count if card == INFINITE_CARDINALITY else UNKNOWN_CARDINALITY)
        return Dataset(lambda: itertools.islice(iter(parent), count),
                       lambda: parent.element_spec, card)

    def skip(self, count: int) -> "Dataset":
        """All but the first ``count`` elements."""
        if not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"skip count must be >= 0, got {count!r}")
        parent = self
        card = self._cardinality
        card = max(card - count, 0) if card >= 0 else card
        return Dataset(lambda: itertools.islice(iter(parent), count, None),
                       lambda: parent.element_spec, card)

    def shard(self, num_shards: int, index: int) -> "Dataset":
        """Elements ``index, index + num_shards, ...`` (one worker's share).

        Raises:
            InvalidArgumentError: ``num_shards`` < 1 or ``index`` outside ``[0, num_shards)``.
        """
        if not isinstance(num_shards, (int, np.integer)) or num_shards < 1:
            raise InvalidArgumentError(f"Number of shards must be >= 1, got {num_shards!r}")
        if not isinstance(index, (int, np.integer)) or not 0 <= index < num_shards:
            raise InvalidArgumentError(
                f"Index must be between 0 and {num_shards - 1} (inclusive), got {index!r}")
        parent = self
        card = self._cardinality
        card = max(-(-(card - index) // num_shards), 0) if card >= 0 else card
        return Dataset(lambda: itertools.islice(iter(parent), index, None, num_shards),
                       lambda: parent.element_spec, card)

    def prefetch(self, buffer_size: int) -> "Dataset":
        """The same dataset (eager numpy has nothing to prefetch); kept for TF code."""
        return self

    def cache(self, filename: str = "") -> "Dataset":
        """The same dataset (its elements are in memory already); kept for TF code."""
        return self


_END = object()
_probe = threading.local()  # set while map() reads a first element for its spec


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class _IterableSource:
    """An iterable (re-iterable, or a one-shot iterator) seen as a dataset source. A one-shot
    iterator is read once: the element peeked for the spec is given back first."""

    def __init__(self, iterable: Iterable):
        self._iterable = iterable
        self._one_shot = iter(iterable) is iterable
        self._peeked: list = []
        self._lock = threading.Lock()

    def first(self) -> Any:
        with self._lock:
            if self._one_shot:
                if not self._peeked:
                    nxt = next(self._iterable, _END)
                    if nxt is _END:
                        raise ValueError("the dataset (an iterator) is empty: no element to "
                                         "tell its shapes from")
                    self._peeked.append(nxt)
                return self._peeked[0]
        nxt = next(iter(self._iterable), _END)
        if nxt is _END:
            raise ValueError("the dataset (an iterable) is empty: no element to tell its "
                             "shapes from")
        return nxt

    def __iter__(self) -> Iterator:
        if not self._one_shot:
            return iter(self._iterable)
        with self._lock:
            peeked, self._peeked = self._peeked, []
        return itertools.chain(peeked, self._iterable)


def as_dataset(obj: Any) -> Dataset:
    """``obj`` if it is a :class:`Dataset`, else a dataset over the iterable ``obj`` (any
    iterable of fixed-shape numpy structures; its spec is its first element's).

    Raises:
        TypeError: ``obj`` is not iterable.
    """
    if isinstance(obj, Dataset):
        return obj
    try:
        iter(obj)
    except TypeError:
        raise TypeError(f"a dataset must be an ipu_node.data.Dataset or an iterable of numpy "
                        f"structures, not {type(obj).__name__}") from None
    source = _IterableSource(obj)
    card = len(obj) if hasattr(obj, "__len__") and not source._one_shot else \
        UNKNOWN_CARDINALITY

    def make_iter():
        return (_nest.map_structure(as_leaf, e) for e in source)

    return Dataset(make_iter, lambda: spec_of(_nest.map_structure(as_leaf, source.first())),
                   card)
