"""``ipu_node.Variable``: a named array that lives on one of the replica's IPUs.

The stand-in for ``tf.Variable`` (reference execution-model.md §4). A Variable made inside a
replica function is placed on the replica's IPU of the current shard
(:func:`ipu_node.scopes.current_shard` when that module is present and a shard scope is
active, else shard 0) and its bytes are accounted in that IPU's SRAM through
:mod:`ipu_node.runtime.memory`; :meth:`Variable.assign` keeps the accounting (same bytes, same
name). A Variable made outside a replica function (host code) is not placed on any IPU
(``ipu_id is None``): ipupod decision, so that host code can build and inspect Variables.

Variables hash by identity: optimizers and pipelines key gradients and slots by them. In
expressions a Variable stands for its value, as a ``tf.Variable`` does (arithmetic, ``@``,
indexing, ``float()``, the numpy array protocol: :mod:`ipu_node.execution._variable_ops`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import numpy as np

from ipu_node.execution._variable_ops import ArrayOps

__all__ = ["Variable"]

_serial = itertools.count()
_serial_lock = threading.Lock()


def _current_shard() -> int:
    """The shard of an active ``ipu_shard`` scope (exec-feeds' :mod:`ipu_node.scopes`), else 0."""
    try:
        from ipu_node.execution import scopes
    except ImportError:  # (scopes arrives with the feeds/loops work)
        return 0
    shard = scopes.current_shard()
    return 0 if shard is None else int(shard)


def _free_quietly(memory, tensor_name: str) -> None:
    try:
        memory.free(tensor_name)
    except KeyError:  # the system was reconfigured, or freed by hand
        pass


class Variable(ArrayOps):
    """A named numpy array on a replica's IPU, changed only through :meth:`assign`.

    Args:
        initial_value: array-like; its dtype and shape are the Variable's for good (a copy is
            kept, so the caller's array is never changed).
        name: the Variable's name (default ``"Variable"``); names need not be unique, the
            SRAM accounting uses a unique tensor name ``"<name>:<serial>"``.
        trainable: whether optimizers should update it (recorded; TF's meaning).
        shard: which of the replica's IPUs (``0 .. ipus_per_replica-1``); None: the current
            ``ipu_shard`` scope's shard, else 0.

    Attributes:
        ipu_id: the IPU whose SRAM holds it, or None outside a replica function.

    Raises:
        IPUOutOfMemoryError: the IPU's SRAM would be exceeded.
        IPUError: ``shard`` is out of the replica's range.
        TypeError: ``name`` is not a str.
    """

    def __init__(self, initial_value: Any, name: str | None = None, trainable: bool = True,
                 shard: int | None = None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Variable name must be a str, not {type(name).__name__}")
        self._value = np.array(initial_value, copy=True)
        self._name = name or "Variable"
        self.trainable = bool(trainable)
        with _serial_lock:
            self._tensor_name = f"{self._name}:{next(_serial)}"
        self.ipu_id: int | None = None
        self.shard: int | None = None
        self._place(shard)

    def _place(self, shard: int | None) -> None:
        from ipu_node.runtime.placement import _target  # the replica's IPU, checked
        from ipu_node.runtime.replica import current_replica_context

        if current_replica_context() is None:
            return
        shard = _current_shard() if shard is None else shard
        memory = _target("ipu_node.Variable", shard, None)
        memory.allocate(self._tensor_name, int(self._value.nbytes))
        self.ipu_id, self.shard = memory.ipu_id, shard
        weakref.finalize(self, _free_quietly, memory, self._tensor_name)

    def _relocate(self, shard: int) -> None:
        """Move the Variable's bytes to the replica's IPU ``shard`` (a pipeline stage that
        uses it runs there). Inside a replica function only."""
        if self.shard == shard or self.ipu_id is None:
            return
        from ipu_node.runtime.placement import _target

        target = _target("ipu_node.Variable", shard, None)
        target.allocate(self._tensor_name, self.nbytes)
        _free_quietly(_target("ipu_node.Variable", 0, self.ipu_id), self._tensor_name)
        self.ipu_id, self.shard = target.ipu_id, shard
        weakref.finalize(self, _free_quietly, target, self._tensor_name)

    @property
    def name(self) -> str:
        return self._name

    @property
    def value(self) -> np.ndarray:
        """The current array (do not modify it in place: use :meth:`assign`)."""
        return self._value

    @property
    def shape(self) -> tuple[int, ...]:
        return self._value.shape

    @property
    def dtype(self) -> np.dtype:
        return self._value.dtype

    @property
    def nbytes(self) -> int:
        return int(self._value.nbytes)

    def numpy(self) -> np.ndarray:
        """A copy of the value (TF's ``Variable.numpy``)."""
        return self._value.copy()

    def assign(self, value: Any) -> None:
        """Replace the value; shape and dtype must stay.

        A value of another dtype that numpy can cast safely (e.g. a Python float for a float32
        Variable) is cast; anything else is refused.

        Raises:
            ValueError: the shape differs (names the Variable and both shapes).
            TypeError: the dtype differs and cannot be cast safely (names both dtypes).
        """
        self._value = self._cast(value)

    def _cast(self, value: Any) -> np.ndarray:
        """``value`` as a new array of this Variable's shape and dtype (``assign``'s checks)."""
        arr = np.asarray(value)
        if arr.shape != self._value.shape:
            raise ValueError(f"Variable {self._name!r}: cannot assign a value of shape "
                             f"{arr.shape} to a Variable of shape {self._value.shape}")
        if arr.dtype != self._value.dtype:
            if not (arr.ndim == 0 and np.can_cast(arr, self._value.dtype, "same_kind")) and \
                    not np.can_cast(arr.dtype, self._value.dtype, "safe"):
                raise TypeError(f"Variable {self._name!r}: cannot assign a value of dtype "
                                f"{arr.dtype} to a Variable of dtype {self._value.dtype}")
            return arr.astype(self._value.dtype)
        return arr.copy()

    def read_value(self) -> np.ndarray:
        """:attr:`value` (TF's name)."""
        return self.value

    def assign_add(self, delta: Any) -> None:
        """``assign(value + delta)``."""
        self.assign(self.value + np.asarray(delta, self.dtype))

    def assign_sub(self, delta: Any) -> None:
        """``assign(value - delta)``."""
        self.assign(self.value - np.asarray(delta, self.dtype))

    def __repr__(self) -> str:
        where = f"IPU {self.ipu_id}" if self.ipu_id is not None else "host"
        return (f"<ipu_node.Variable {self._name!r} shape={self.shape} dtype={self.dtype} "
                f"on {where}>")

    # identity semantics (dict keys): never value equality
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other
