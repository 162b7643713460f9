"""The elements of a dataset (:mod:`ipu_node.execution.data`): their leaves as numpy arrays
or scalars, their specs (:class:`TensorSpec`, ``tf.TensorSpec``), and a batch of them stacked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ipu_node import nest as _nest
from ipu_node.errors import InvalidArgumentError

__all__ = ["TensorSpec", "as_leaf", "lists_to_arrays", "spec_of", "stack_elements"]


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one leaf of a dataset element (``tf.TensorSpec``).

    Attributes:
        shape: dimensions; ``None`` where unknown (the batch dimension of
            ``batch(n, drop_remainder=False)``).
        dtype: a numpy dtype.
    """

    shape: tuple
    dtype: np.dtype

    def is_fully_defined(self) -> bool:
        """Whether every dimension is known."""
        return all(d is not None for d in self.shape)

    @staticmethod
    def of(value: Any) -> "TensorSpec":
        """The spec of one array or scalar."""
        arr = np.asarray(value)
        return TensorSpec(tuple(arr.shape), arr.dtype)


def as_leaf(value: Any) -> Any:
    """A dataset leaf: numpy arrays stay, numpy scalars stay, the rest goes through asarray."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value
    arr = np.asarray(value)
    return arr[()] if arr.ndim == 0 else arr


def lists_to_arrays(value: Any) -> Any:
    """``value`` with every list (and other non-structure leaf) as a numpy array: tuples,
    named tuples and dicts stay structure (``from_tensor_slices``' rule)."""
    if isinstance(value, dict):
        return {k: lists_to_arrays(v) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [lists_to_arrays(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return np.asarray(value)


def spec_of(element: Any) -> Any:
    """The nest of :class:`TensorSpec` of one element."""
    return _nest.map_structure(TensorSpec.of, element)


def stack_elements(chunk: list) -> Any:
    """The elements of ``chunk`` stacked leaf by leaf into one batch (``Dataset.batch``).

    Raises:
        InvalidArgumentError: two elements differ in structure or in a leaf's shape
            (tf.data's messages).
    """
    flat = [_nest.flatten(e) for e in chunk]
    treedef = flat[0][1]
    for j, (_, t) in enumerate(flat[1:], 1):
        if t != treedef:
            raise InvalidArgumentError(
                f"Cannot batch elements of different structures: element 0 is "
                f"{_nest.describe(treedef)}, element {j} is {_nest.describe(t)}")
    out = []
    for c in range(len(flat[0][0])):
        parts = [np.asarray(leaves[c]) for leaves, _ in flat]
        for j, p in enumerate(parts[1:], 1):
            if p.shape != parts[0].shape:
                raise InvalidArgumentError(
                    f"Cannot batch tensors with different shapes in component {c}. First "
                    f"element had shape {list(parts[0].shape)} and element {j} had shape "
                    f"{list(p.shape)}.")
        out.append(np.stack(parts))
    return _nest.unflatten(treedef, out)
