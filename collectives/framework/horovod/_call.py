"""One Horovod call on a process set, and the checks of its arguments (horovod.torch's).

Every call runs the agreement of :mod:`collectives.framework.horovod._request` first, so ranks that
disagree raise ``CollectiveMismatchError`` on every rank and the next call works. A rank
whose arguments are invalid (:meth:`Call.checking`) takes part in that agreement with its
error, so every rank of the process set raises it, instead of the others waiting for a
call it will not make; the rank itself raises its own ``ValueError``/``TypeError``.
"""

from __future__ import annotations

import warnings

import numpy as np

from collectives.errors import CollectiveError, CollectiveTypeError
from collectives.framework.horovod._state import ProcessSet, state
from collectives.framework.horovod._request import Signature, agree, error_signature
from collectives.ops import SUPPORTED_DTYPES

Sum, Average, Min, Max, Product, Adasum = "Sum", "Average", "Min", "Max", "Product", "Adasum"
OPS = (Sum, Average, Min, Max, Product, Adasum)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)


class Call:
    """One call on a process set: the engine, the members and their communicator.

    Raises (when made, on this rank only, as Horovod's, which enqueues nothing):
        TypeError: ``process_set`` is not a ProcessSet.
        ValueError: it is not registered, or this rank is not a member.
    """

    def __init__(self, process_set: ProcessSet, what: str):
        s = state()
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"hvd.{what}: process_set must be a ProcessSet, not "
                            f"{type(process_set).__name__}")
        if process_set.process_set_id is None or process_set.process_set_id not in s.sets:
            raise ValueError(f"hvd.{what}: {process_set!r} is not registered "
                             "(hvd.add_process_set)")
        self.members = tuple(process_set.ranks)
        if s.rank not in self.members:
            raise ValueError(f"hvd.{what}: rank {s.rank} is not in process set "
                             f"{process_set.process_set_id} (ranks {list(self.members)})")
        self.what = what
        self.engine = s.engine
        self.set = process_set
        self.comm = self.engine.communicator(self.members) if len(self.members) > 1 else None
        self.size = len(self.members)
        self.position = self.members.index(s.rank)
        self.lock = s.lock

    def agree(self, sig: Signature | None, sizes=None, join_pos: int = -1):
        self.set._calls += 1
        return agree(self.engine, self.comm, self.members, sig, sizes, join_pos)

    def checking(self) -> "_Checking":
        """Check the call's arguments inside (``with call.checking():``): a
        ``ValueError``/``TypeError`` raised there is the call's argument error: every rank
        of the set raises it (:meth:`fail`)."""
        return _Checking(self)

    def fail(self, exc: BaseException) -> None:
        """Take part in the agreement with the error ``exc``, then raise it.

        Raises:
            exc: always (the others raise it too, naming this rank).
        """
        with self.lock:
            try:
                self.agree(error_signature(self.what, exc))
            except CollectiveError:
                pass  # (the others' side of the same failure; this rank raises its own)
        raise exc


class _Checking:
    """The context of :meth:`Call.checking` (a class, not a generator: one per call)."""

    __slots__ = ("call",)

    def __init__(self, call: Call):
        self.call = call

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is not None and isinstance(exc, (ValueError, TypeError)):
            self.call.fail(exc)
        return False


def op_of(op, average, what: str) -> str:
    """The reduction op of a call that takes both ``average`` (deprecated) and ``op``, as
    Horovod's ``handle_average_backwards_compatibility``: ``op`` when given (and then not
    ``average``), else Average/Sum from ``average`` with Horovod's DeprecationWarning, else
    Average.

    Raises:
        ValueError: both given (Horovod's message), or an unknown op.
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
    elif average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    return checked_op(op, what)


def checked_op(op, what: str, default: str = Average) -> str:
    """``op`` (None: ``default``), one of :data:`OPS`.

    Raises:
        ValueError: another value (names it and the known ones).
    """
    op = default if op is None else op
    if op not in OPS:
        raise ValueError(f"hvd.{what}: unknown op {op!r}; use hvd.Sum, Average, Min, Max, "
                         "Product or Adasum")
    return op


def supported(arr: np.ndarray, what: str) -> np.ndarray:
    """``arr`` if its dtype is one a collective takes.

    Raises:
        CollectiveTypeError: another dtype (names it and the supported ones).
    """
    if arr.dtype not in _SUPPORTED:
        raise CollectiveTypeError(f"hvd.{what}: dtype {arr.dtype} is not supported; use one "
                                  f"of {', '.join(d.name for d in SUPPORTED_DTYPES)}")
    return arr


def movable(arr: np.ndarray, what: str) -> np.ndarray:
    """``arr`` if the collectives that move data (allgather, broadcast, alltoall) take its
    dtype: any bool, integer, float or complex dtype (they move bytes; Horovod's uint8,
    int8, int16 included).

    Raises:
        CollectiveTypeError: another dtype (objects, strings...).
    """
    if arr.dtype.kind not in "biufc":
        raise CollectiveTypeError(f"hvd.{what}: dtype {arr.dtype} cannot be sent; use a "
                                  "numeric or bool dtype")
    return arr


def reduction_dtypes(arrays, op: str, what: str) -> None:
    """Refuse dtypes ``op`` cannot reduce.

    Raises:
        CollectiveTypeError: bool, or Adasum of integers.
    """
    for a in arrays:
        if a.dtype == np.bool_:
            raise CollectiveTypeError(f"hvd.{what}: bool tensors cannot be reduced "
                                      f"(op {op}); cast them to int32")
        if op == Adasum and not np.issubdtype(a.dtype, np.floating):
            raise CollectiveTypeError(f"hvd.{what}: Adasum needs floating-point tensors, "
                                      f"got {a.dtype}")


def factor(value, what: str, name: str) -> float:
    """A scale factor as a float.

    Raises:
        TypeError: not a number (names it).
    """
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"hvd.{what}: {name} must be a number, got {value!r}") from None
