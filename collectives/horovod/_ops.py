"""Horovod's tensor collectives (horovod.torch names and semantics) on numpy arrays.

Every call runs the agreement of :mod:`collectives.horovod._wire` first, so ranks that
disagree raise ``CollectiveMismatchError`` on every rank and the next call works.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._fusion import grouped_per_dtype
from collectives.errors import CollectiveArgumentError, CollectiveTypeError
from collectives.horovod import _data
from collectives.horovod._state import ProcessSet, global_process_set, state
from collectives.horovod._wire import Signature, agree
from collectives.ops import SUPPORTED_DTYPES

Sum, Average, Min, Max, Product, Adasum = "Sum", "Average", "Min", "Max", "Product", "Adasum"
_OPS = (Sum, Average, Min, Max, Product, Adasum)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)


class _Call:
    """One call on a process set: the engine, the members and their communicator."""

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
        self.engine = s.engine
        self.set = process_set
        self.comm = s.engine.communicator(self.members) if len(self.members) > 1 else None
        self.size = len(self.members)
        self.lock = s.lock

    def agree(self, sig: Signature | None, sizes=None, join_pos: int = -1):
        self.set._calls += 1
        return agree(self.engine, self.comm, self.members, sig, sizes, join_pos)


def _array(x, what: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype not in _SUPPORTED:
        raise CollectiveTypeError(f"hvd.{what}: dtype {arr.dtype} is not supported; use one "
                                  f"of {', '.join(d.name for d in SUPPORTED_DTYPES)}")
    return np.ascontiguousarray(arr)


def _op(op, what: str, default: str = Average) -> str:
    op = default if op is None else op
    if op not in _OPS:
        raise ValueError(f"hvd.{what}: unknown op {op!r}; use hvd.Sum, Average, Min, Max, "
                         "Product or Adasum")
    return op


def _reduce_dtype_check(arrays, op: str, what: str) -> None:
    for a in arrays:
        if a.dtype == np.bool_:
            raise CollectiveTypeError(f"hvd.{what}: bool tensors cannot be reduced "
                                      f"(op {op}); cast them to int32")
        if op == Adasum and not np.issubdtype(a.dtype, np.floating):
            raise CollectiveTypeError(f"hvd.{what}: Adasum needs floating-point tensors, "
                                      f"got {a.dtype}")


def _factor(value, what: str, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"hvd.{what}: {name} must be a number, got {value!r}") from None


# -- allreduce -------------------------------------------------------------------------


def _allreduce_signature(arrays, op, pre, post, ps, name, grouped) -> Signature:
    return Signature("allreduce", {"op": op, "prescale_factor": pre, "postscale_factor": post,
                                   "process_set": ps.process_set_id, "name": name,
                                   "grouped": grouped},
                     [(a.dtype.name, a.shape) for a in arrays])


def _allreduce_data(call: _Call, sig: Signature, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The data of an agreed allreduce (zeros from a joined rank)."""
    op = sig.fields["op"]
    pre, post = sig.fields["prescale_factor"], sig.fields["postscale_factor"]
    if op == Average:
        post = post / call.size  # Horovod: averaging happens via the postscale factor
    arrays = [_data.scale(a, pre) for a in arrays]
    if op == Adasum:
        reduced = _data.adasum_tensors(call.engine, call.comm, call.members, arrays)
        return [_data.scale(r, post) for r in reduced]
    return grouped_per_dtype(arrays, lambda group, dtype: _data.allreduce_group(
        call.engine, call.comm, call.members, group, op, post))  # Horovod's fusion


def grouped_allreduce(tensors: Sequence, name: str | None = None, op=None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Allreduce a list of tensors as one fused operation (per dtype one buffer).

    Args:
        tensors: array-likes (float16/32/64, int32/64); shapes may differ from each other
            but each must be the same on every rank of the set.
        name: optional label (must be the same on every rank).
        op: ``Sum``, ``Average`` (None: Average), ``Min``, ``Max``, ``Product``, ``Adasum``.
        prescale_factor, postscale_factor: multiply before / after the reduction, as
            Horovod's CPU ScaleBuffer (:func:`collectives.horovod._data.scale`); Average
            divides the postscale factor by the set's size (so integer averages truncate
            toward zero, as Horovod's).
        process_set: the ranks taking part (this rank must be one).

    Returns:
        New arrays, shapes and dtypes of the inputs, the same on every rank of the set.

    Raises:
        CollectiveTypeError: an unsupported dtype, bool, or Adasum of integers.
        ValueError: an unknown op; this rank not in ``process_set``.
        CollectiveMismatchError: on every rank, when ranks disagree (shapes, dtypes, op,
            scale factors, name, number of tensors, kind of collective).
    """
    what = "grouped_allreduce"
    op = _op(op, what)
    arrays = [_array(t, what) for t in tensors]
    _reduce_dtype_check(arrays, op, what)
    pre = _factor(prescale_factor, what, "prescale_factor")
    post = _factor(postscale_factor, what, "postscale_factor")
    call = _Call(process_set, what)
    sig = _allreduce_signature(arrays, op, pre, post, process_set, name, True)
    with call.lock:
        call.agree(sig)
        return _allreduce_data(call, sig, arrays)


def allreduce(tensor, name: str | None = None, op=None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduce ``tensor`` over the ranks of ``process_set`` (op None: Average, as the seeds
    and Horovod say). Same arguments, result and errors as :func:`grouped_allreduce` for one
    tensor; returns a new array."""
    what = "allreduce"
    op = _op(op, what)
    arr = _array(tensor, what)
    _reduce_dtype_check([arr], op, what)
    pre = _factor(prescale_factor, what, "prescale_factor")
    post = _factor(postscale_factor, what, "postscale_factor")
    call = _Call(process_set, what)
    sig = _allreduce_signature([arr], op, pre, post, process_set, name, False)
    with call.lock:
        call.agree(sig)
        return _allreduce_data(call, sig, [arr])[0]


def _write_into(targets, results, what: str):
    for t, r in zip(targets, results):
        if not isinstance(t, np.ndarray) or not t.flags.writeable:
            raise TypeError(f"hvd.{what}: in-place ops need writeable numpy arrays, got "
                            f"{type(t).__name__}")
        np.copyto(t, r)
    return targets


def allreduce_(tensor: np.ndarray, name: str | None = None, op=None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """:func:`allreduce` written into ``tensor`` (a writeable numpy array); returns it."""
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"hvd.allreduce_: in-place ops need a numpy array, got "
                        f"{type(tensor).__name__}")
    result = allreduce(tensor, name, op, prescale_factor, postscale_factor, process_set)
    return _write_into([tensor], [result], "allreduce_")[0]


def grouped_allreduce_(tensors: Sequence[np.ndarray], name: str | None = None, op=None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """:func:`grouped_allreduce` written into ``tensors`` (writeable numpy arrays)."""
    for t in tensors:
        if not isinstance(t, np.ndarray):
            raise TypeError(f"hvd.grouped_allreduce_: in-place ops need numpy arrays, got "
                            f"{type(t).__name__}")
    results = grouped_allreduce(tensors, name, op, prescale_factor, postscale_factor,
                                process_set)
    return _write_into(list(tensors), results, "grouped_allreduce_")


# -- allgather -------------------------------------------------------------------------


def _allgather_signature(arrays, ps, name, grouped) -> Signature:
    return Signature("allgather", {"process_set": ps.process_set_id, "name": name,
                                   "grouped": grouped},
                     [(a.dtype.name, a.shape[1:]) for a in arrays])


def _allgather_data(call: _Call, arrays: list[np.ndarray], dim0s: np.ndarray) -> list:
    """``dim0s[member, tensor]``: the first dimensions every member brings."""
    out = []
    for t, a in enumerate(arrays):
        row = int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize
        counts = [int(d) * row for d in dim0s[:, t]]
        raw = _data.allgather_bytes(call.engine, call.comm, call.members,
                                    a.reshape(-1).view(np.uint8), counts)
        out.append(np.frombuffer(raw, a.dtype).reshape((int(dim0s[:, t].sum()),) + a.shape[1:])
                   .copy())
    return out


def _gather_arrays(tensors, what: str) -> list[np.ndarray]:
    arrays = [_array(t, what) for t in tensors]
    for a in arrays:
        if a.ndim == 0:
            raise CollectiveArgumentError(f"hvd.{what}: tensors need at least one dimension "
                                          "(concatenated on dimension 0)")
    return arrays


def grouped_allgather(tensors: Sequence, name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Concatenate each tensor over the ranks on dimension 0 (rank order).

    Args:
        tensors: array-likes of rank >= 1, any supported dtype; the first dimension may
            differ between ranks, the others and the dtype may not.

    Returns:
        New arrays ``[sum of first dims, *rest]``.

    Raises:
        CollectiveArgumentError: a 0-d tensor; and as :func:`grouped_allreduce`.
    """
    what = "grouped_allgather"
    arrays = _gather_arrays(tensors, what)
    call = _Call(process_set, what)
    sig = _allgather_signature(arrays, process_set, name, True)
    with call.lock:
        agreed = call.agree(sig, np.array([a.shape[0] for a in arrays], np.int64))
        return _allgather_data(call, arrays, agreed.sizes)


def allgather(tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate ``tensor`` over the ranks on dimension 0 (rank order); first dimensions
    may differ. See :func:`grouped_allgather`."""
    (arr,) = _gather_arrays([tensor], "allgather")
    return allgather_array(arr, name, process_set)


def allgather_array(arr: np.ndarray, name: str | None, process_set: ProcessSet) -> np.ndarray:
    """:func:`allgather` of a contiguous array of rank >= 1 of any fixed-size dtype."""
    what = "allgather"
    call = _Call(process_set, what)
    sig = _allgather_signature([arr], process_set, name, False)
    with call.lock:
        agreed = call.agree(sig, np.array([arr.shape[0]], np.int64))
        return _allgather_data(call, [arr], agreed.sizes)[0]


# -- broadcast -------------------------------------------------------------------------


def _root(root_rank, call: _Call, what: str) -> int:
    """The member index of ``root_rank``, a global rank (as Horovod's: its process-set tests
    broadcast from each of the set's global ranks)."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) \
            or int(root_rank) not in call.members:
        raise ValueError(f"hvd.{what}: root_rank={root_rank!r} is not a rank of the process "
                         f"set (ranks {list(call.members)})")
    return call.members.index(int(root_rank))


def broadcast(tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """``tensor`` of rank ``root_rank`` on every rank of the set.

    ``root_rank`` is a global rank, a member of ``process_set`` (as in Horovod, whose
    process-set tests broadcast from the set's global ranks). Shapes and dtype must agree on
    every rank.

    Returns:
        A new array with the root's values.

    Raises:
        ValueError: ``root_rank`` out of range; CollectiveMismatchError on every rank when
            ranks disagree (shape, dtype, root, name).
    """
    return broadcast_array(_array(tensor, "broadcast"), root_rank, name, process_set)


def broadcast_array(arr: np.ndarray, root_rank: int, name: str | None,
                    process_set: ProcessSet) -> np.ndarray:
    """:func:`broadcast` of a contiguous array of any fixed-size dtype (uint8 included:
    the object functions send bytes)."""
    what = "broadcast"
    call = _Call(process_set, what)
    root = _root(root_rank, call, what)
    sig = Signature("broadcast", {"root_rank": int(root_rank),
                                  "process_set": process_set.process_set_id,
                                  "name": name}, [(arr.dtype.name, arr.shape)])
    with call.lock:
        call.agree(sig)
        raw = _data.broadcast_bytes(call.engine, call.comm, call.members,
                                    arr.reshape(-1).view(np.uint8), root)
    return np.frombuffer(raw, arr.dtype).reshape(arr.shape).copy()


def broadcast_(tensor: np.ndarray, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> np.ndarray:
    """:func:`broadcast` written into ``tensor`` (a writeable numpy array); returns it."""
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"hvd.broadcast_: in-place ops need a numpy array, got "
                        f"{type(tensor).__name__}")
    return _write_into([tensor], [broadcast(tensor, root_rank, name, process_set)],
                       "broadcast_")[0]


def broadcast_parameters(params, root_rank: int = 0,
                         process_set: ProcessSet = global_process_set) -> None:
    """Broadcast, in place, a dict of numpy arrays (``state_dict``-like) or a list of
    ``(name, array)`` pairs from ``root_rank`` (horovod.torch's). Keys are visited in sorted
    order on every rank (as Horovod), one fused broadcast per call.

    Raises:
        TypeError: ``params`` is neither, or a value is not a writeable numpy array.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)):
        items = list(params)
        if any(not (isinstance(p, tuple) and len(p) == 2) for p in items):
            raise TypeError("broadcast_parameters: a list must hold (name, array) pairs")
    else:
        raise TypeError(f"broadcast_parameters: params must be a dict or a list of "
                        f"(name, array) pairs, not {type(params).__name__}")
    arrays = [p for _, p in items]
    if not arrays:
        return
    for key, p in items:
        if not isinstance(p, np.ndarray) or not p.flags.writeable:
            raise TypeError(f"broadcast_parameters: {key!r} is not a writeable numpy array")
    flat = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
    joined = broadcast_array(np.concatenate(flat) if len(flat) > 1 else flat[0].copy(), root_rank,
                             "broadcast_parameters", process_set)
    pos = 0
    for a in arrays:
        a[...] = np.frombuffer(joined[pos:pos + a.nbytes], a.dtype).reshape(a.shape)
        pos += a.nbytes


# -- barrier and join ------------------------------------------------------------------


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return when every rank of the set has called it (a rank that has joined counts)."""
    call = _Call(process_set, "barrier")
    with call.lock:
        call.agree(Signature("barrier", {"process_set": process_set.process_set_id}))


def join(device: int = -1) -> int:
    """This rank has no more data: until every rank has joined, it takes part in the other
    ranks' allreduce (contributing zeros; Sum and Average only), allgather (contributing no
    rows) and barrier calls. ``device`` is accepted for horovod.torch's signature.

    Returns:
        The rank that joined last (the highest rank among those that joined in the same
        round), the same on every rank.

    Raises:
        CollectiveMismatchError: on every rank, when the others call a collective joined
            ranks cannot take part in (broadcast, alltoall, reducescatter), or disagree.
    """
    call = _Call(global_process_set, "join")
    with call.lock:
        position = global_process_set._calls
        while True:
            agreed = call.agree(None, join_pos=position)
            if agreed.all_joined:
                last = max(range(call.size), key=lambda i: (agreed.join_positions[i], i))
                return call.members[last]
            sig = agreed.signature
            if sig.kind == "allreduce":
                zeros = [np.zeros(tuple(shape), np.dtype(d)) for d, shape in sig.tensors]
                _allreduce_data(call, sig, zeros)
            elif sig.kind == "allgather":
                empty = [np.zeros((0,) + tuple(shape), np.dtype(d)) for d, shape in sig.tensors]
                _allgather_data(call, empty, agreed.sizes)
