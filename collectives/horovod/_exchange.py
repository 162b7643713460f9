"""Horovod's alltoall and reducescatter (horovod.torch names and semantics) on numpy arrays:
the collectives whose every rank gets a different part. Same agreement and errors as
:mod:`collectives.horovod._ops`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.horovod import _data
from collectives.horovod._ops import (Average, Sum, _Call, _factor, _gather_arrays, _op,
                                      _reduce_dtype_check)
from collectives.horovod._state import ProcessSet, global_process_set, state
from collectives.horovod._wire import Signature


def alltoall(tensor, splits=None, name: str | None = None,
             process_set: ProcessSet = global_process_set):
    """Send rows of ``tensor`` to every rank: the first ``splits[0]`` rows to rank 0 of the
    set, the next ``splits[1]`` to rank 1, ...; receive and concatenate in rank order.

    Args:
        tensor: array-like of rank >= 1; trailing dimensions and dtype the same everywhere.
        splits: ``size`` non-negative ints summing to ``tensor.shape[0]``; None: equal
            parts (the first dimension must divide by the set's size).

    Returns:
        The received array; with ``splits`` given, ``(received, received_splits)``, the
        latter ``int32[size]``: the rows received from each rank (horovod.torch's).

    Raises:
        ValueError: bad ``splits``; CollectiveMismatchError on every rank on disagreement.
    """
    what = "alltoall"
    (arr,) = _gather_arrays([tensor], what)
    call = _Call(process_set, what)
    P = call.size
    if splits is None:
        if arr.shape[0] % P:
            raise ValueError(f"hvd.alltoall: the first dimension ({arr.shape[0]}) must divide "
                             f"by the number of ranks ({P}) when splits is None")
        mine = np.full(P, arr.shape[0] // P, np.int64)
    else:
        mine = np.asarray(splits).astype(np.int64).reshape(-1)
        if mine.size != P or (mine < 0).any() or int(mine.sum()) != arr.shape[0]:
            raise ValueError(f"hvd.alltoall: splits {list(np.asarray(splits).reshape(-1))} "
                             f"must be {P} non-negative ints summing to the first dimension "
                             f"({arr.shape[0]})")
    sig = Signature("alltoall", {"process_set": process_set.process_set_id, "name": name},
                    [(arr.dtype.name, arr.shape[1:])])
    with call.lock:
        matrix = call.agree(sig, mine).sizes  # matrix[i, j]: rows rank i sends to rank j
        row = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.itemsize
        me = call.members.index(state().rank)
        got = matrix[:, me]
        raw = _data.alltoall_bytes(call.engine, call.comm, call.members,
                                   arr.reshape(-1).view(np.uint8),
                                   [int(c) * row for c in mine], [int(c) * row for c in got])
    out = np.frombuffer(raw, arr.dtype).reshape((int(got.sum()),) + arr.shape[1:]).copy()
    return out if splits is None else (out, got.astype(np.int32))


def _reducescatter_data(call: _Call, sig: Signature, arrays: list[np.ndarray]) -> list:
    op = sig.fields["op"]
    pre, post = sig.fields["prescale_factor"], sig.fields["postscale_factor"]
    if op == Average:
        post = post / call.size
    P, me = call.size, call.members.index(state().rank)
    out: list = [None] * len(arrays)
    by_dtype: dict = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        rows = {i: _data.split_counts(arrays[i].shape[0], P) for i in idx}
        width = {i: int(np.prod(arrays[i].shape[1:], dtype=np.int64)) for i in idx}
        scaled = {i: _data.scale(arrays[i], pre).reshape(arrays[i].shape[0], -1) for i in idx}
        blocks, send_counts = [], []
        for j in range(P):  # member j's block: its rows of every tensor, tensor order
            parts = [scaled[i][sum(rows[i][:j]):sum(rows[i][:j + 1])].reshape(-1) for i in idx]
            blocks.extend(parts)
            send_counts.append(sum(p.size for p in parts) * dtype.itemsize)
        mine = sum(rows[i][me] * width[i] for i in idx)
        send = np.concatenate(blocks).astype(dtype, copy=False) if blocks else np.zeros(0, dtype)
        raw = _data.alltoall_bytes(call.engine, call.comm, call.members,
                                   np.ascontiguousarray(send).view(np.uint8), send_counts,
                                   [mine * dtype.itemsize] * P)
        pieces = list(np.frombuffer(raw, dtype).reshape(P, mine))
        total = _data.scale(_data.reduce_pieces(pieces, op) if mine else np.zeros(0, dtype),
                            post)
        pos = 0
        for i in idx:
            n = rows[i][me] * width[i]
            out[i] = np.array(total[pos:pos + n]).reshape((rows[i][me],) + arrays[i].shape[1:])
            pos += n
    return out


def grouped_reducescatter(tensors: Sequence, name: str | None = None, op=Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[np.ndarray]:
    """Reduce each tensor over the ranks and give rank j its part of dimension 0: Horovod's
    uneven split, ``n // size`` rows each and one more for the first ``n % size`` ranks.

    Args:
        tensors: array-likes of rank >= 1 (float16/32/64, int32/64), the same shapes on
            every rank.
        op: ``Sum`` or ``Average`` (Horovod's reducescatter offers these two).
        prescale_factor, postscale_factor: as :func:`grouped_allreduce`.

    Returns:
        New arrays ``[rows of this rank, *rest]``.

    Raises:
        ValueError: another op; and as :func:`grouped_allreduce`.
    """
    what = "grouped_reducescatter"
    op = _op(op, what)
    if op not in (Sum, Average):
        raise ValueError(f"hvd.{what}: op must be hvd.Sum or hvd.Average, not {op}")
    arrays = _gather_arrays(tensors, what)
    _reduce_dtype_check(arrays, op, what)
    pre = _factor(prescale_factor, what, "prescale_factor")
    post = _factor(postscale_factor, what, "postscale_factor")
    call = _Call(process_set, what)
    sig = Signature("reducescatter", {"op": op, "prescale_factor": pre,
                                      "postscale_factor": post, "name": name,
                                      "process_set": process_set.process_set_id},
                    [(a.dtype.name, a.shape) for a in arrays])
    with call.lock:
        call.agree(sig)
        return _reducescatter_data(call, sig, arrays)


def reducescatter(tensor, name: str | None = None, op=Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    """:func:`grouped_reducescatter` of one tensor."""
    return grouped_reducescatter([tensor], name, op, process_set, prescale_factor,
                                 postscale_factor)[0]


