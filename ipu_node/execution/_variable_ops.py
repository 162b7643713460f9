"""Arithmetic and the numpy protocols of :class:`ipu_node.Variable`, as ``tf.Variable`` has
them: a Variable in an expression stands for its current value, so the seeds' decay
``MapGradientOptimizer(opt, lambda g, v: g + WD * v)`` (seed 004:5965-5989) and
``np.sum(w)``, ``w @ x``, ``w[0]``, ``float(w)`` work. Results are plain arrays (or numpy
scalars), never Variables; only ``assign`` changes a Variable.

Equality stays identity (optimizers and pipelines key dictionaries by Variable), so
``w == x`` is ``w is x``; compare values with ``w.value == x`` or ``np.equal(w, x)``.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["ArrayOps"]


def _binary(op):
    def forward(self, other):
        return op(self.value, _plain(other))

    def reflected(self, other):
        return op(_plain(other), self.value)
    return forward, reflected


def _plain(x: Any) -> Any:
    """A Variable's value, anything else as it is."""
    return x.value if isinstance(x, ArrayOps) else x


class ArrayOps:
    """Operators on ``self.value`` (a numpy array); mixed into :class:`ipu_node.Variable`."""

    __add__, __radd__ = _binary(operator.add)
    __sub__, __rsub__ = _binary(operator.sub)
    __mul__, __rmul__ = _binary(operator.mul)
    __truediv__, __rtruediv__ = _binary(operator.truediv)
    __floordiv__, __rfloordiv__ = _binary(operator.floordiv)
    __mod__, __rmod__ = _binary(operator.mod)
    __pow__, __rpow__ = _binary(operator.pow)
    __matmul__, __rmatmul__ = _binary(operator.matmul)
    __and__, __rand__ = _binary(operator.and_)
    __or__, __ror__ = _binary(operator.or_)
    __xor__, __rxor__ = _binary(operator.xor)
    __lt__ = _binary(operator.lt)[0]
    __le__ = _binary(operator.le)[0]
    __gt__ = _binary(operator.gt)[0]
    __ge__ = _binary(operator.ge)[0]

    def __neg__(self):
        return -self.value

    def __pos__(self):
        return +self.value

    def __abs__(self):
        return abs(self.value)

    def __invert__(self):
        return ~self.value

    def __getitem__(self, index):
        return self.value[index]

    def __len__(self) -> int:
        return len(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __index__(self) -> int:
        return operator.index(self.value[()]) if self.value.ndim == 0 else \
            operator.index(self.value)

    def __array__(self, dtype=None, copy=None):
        value = self.value
        if dtype is not None:
            return value.astype(dtype)
        return np.array(value, copy=True) if copy else value

    @property
    def ndim(self) -> int:
        return self.value.ndim

    @property
    def size(self) -> int:
        return self.value.size

    @property
    def T(self) -> np.ndarray:
        return self.value.T
