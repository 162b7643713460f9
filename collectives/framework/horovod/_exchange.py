"""Horovod's alltoall and reducescatter (horovod.torch names and semantics) on numpy arrays
and torch tensors: the collectives whose every rank gets a different part. Same agreement
and errors as the others (:mod:`collectives.framework.horovod._call`): an argument error (Horovod's
messages) is raised on every rank of the set.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.framework.horovod import _data
from collectives.framework.horovod._call import (Adasum, Average, Call, checked_op, factor, movable,
                                       reduction_dtypes, supported)
from collectives.framework.horovod._compression import Compression
from collectives.framework.horovod._move import gather_shape, refuse_scalars
from collectives.framework.horovod._state import ProcessSet, global_process_set
from collectives.framework.horovod._tensors import (from_array, is_torch, reduction_check, to_array,
                                          torch_module)
from collectives.framework.horovod._request import Signature


def _splits(splits, rows: int, P: int) -> np.ndarray:
    """This rank's ``splits`` as int64 (Horovod's checks and messages).

    Raises:
        ValueError: not 1-D, not integers, not ``P`` of them, negative, or more rows than
            the tensor has; None with a first dimension that ``P`` does not divide.
    """
    if splits is None:
        if rows % P:
            raise ValueError("splits not provided, but first dimension of tensor is not an "
                             "even multiple of the number of workers.")
        return np.full(P, rows // P, np.int64)
    raw = splits.detach().cpu().numpy() if is_torch(splits) else np.asarray(splits)
    if raw.ndim > 1:
        raise ValueError("alltoall expects a 1D splits tensor")
    if raw.dtype == np.bool_ or not (np.issubdtype(raw.dtype, np.integer) or (
            raw.dtype == object and all(isinstance(v, (int, np.integer))
                                        and not isinstance(v, bool) for v in raw.ravel()))):
        raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
    mine = raw.astype(np.int64).reshape(-1)
    if mine.size != P:
        raise ValueError("Number of entries in splits does not equal number of workers.")
    if (mine < 0).any():
        raise ValueError(f"alltoall splits must not be negative, got {mine.tolist()}")
    if int(mine.sum()) > rows:
        raise ValueError("Sum of splits entries is greater than the first dimension of "
                         "tensor.")
    return mine


def alltoall(tensor, splits=None, name: str | None = None,
             process_set: ProcessSet = global_process_set):
    """Send rows of ``tensor`` to every rank: the first ``splits[0]`` rows to rank 0 of the
    set, the next ``splits[1]`` to rank 1, ...; receive and concatenate in rank order.

    Args:
        tensor: a numpy array-like or torch tensor of rank >= 1; trailing dimensions and
            dtype the same everywhere.
        splits: ``size`` non-negative integers (a list, array or int32 tensor) summing to at
            most ``tensor.shape[0]`` (rows past their sum are not sent, as Horovod); None:
            equal parts (the first dimension must divide by the set's size).

    Returns:
        The received tensor (the input's type); with ``splits`` given,
        ``(received, received_splits)``, the latter int32 (a tensor for a torch input): the
        rows received from each rank (horovod.torch's).

    Raises:
        ValueError: bad ``splits`` (Horovod's messages: "alltoall expects splits to contain
            32-bit integer elements.", ...), on every rank of the set.
        CollectiveArgumentError: a 0-d tensor (on every rank); CollectiveMismatchError on
            every rank on disagreement.
    """
    call = Call(process_set, "alltoall")
    with call.checking():
        arr, like = to_array(tensor)
        movable(arr, call.what)
        mine = _splits(splits, arr.shape[0] if arr.ndim else 0, call.size)
    sig = Signature("alltoall", {"process_set": process_set.process_set_id, "name": name},
                    [(arr.dtype.name, gather_shape(arr))])
    with call.lock:
        agreed = call.agree(sig, mine)
        refuse_scalars(agreed.signature, "ALLTOALL")
        matrix = agreed.sizes  # matrix[i, j]: rows rank i sends to rank j
        row = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.itemsize
        got = matrix[:, call.position]
        send = arr.reshape(-1).view(np.uint8)[:int(mine.sum()) * row]
        raw = _data.alltoall_bytes(call.engine, call.comm, call.members, send,
                                   [int(c) * row for c in mine], [int(c) * row for c in got])
    out = from_array(np.frombuffer(raw, arr.dtype).reshape((int(got.sum()),) + arr.shape[1:])
                     .copy(), like)
    if splits is None:
        return out
    received = got.astype(np.int32)
    return out, (torch_module().from_numpy(received) if like.is_torch else received)


def _reducescatter_data(call: Call, sig: Signature, arrays: list[np.ndarray]) -> list:
    op = sig.fields["op"]
    pre, post = sig.fields["prescale_factor"], sig.fields["postscale_factor"]
    if op == Average:
        post = post / call.size
    P, me = call.size, call.position
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


def grouped_reducescatter(tensors: Sequence, name: str | None = None,
                          compression=Compression.none, op=Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list:
    """Reduce each tensor over the ranks and give rank j its part of dimension 0: Horovod's
    uneven split, ``n // size`` rows each and one more for the first ``n % size`` ranks.

    Args:
        tensors: numpy array-likes or torch tensors of rank >= 1 (float16/32/64,
            int32/64), the same shapes on every rank.
        compression: as :func:`~collectives.framework.horovod.allreduce`.
        op: ``Sum``, ``Average`` (default), ``Min``, ``Max``, ``Product`` (Horovod's
            reducescatter ops; not Adasum).
        prescale_factor, postscale_factor: as :func:`~collectives.framework.horovod.allreduce`.

    Returns:
        New tensors of the inputs' types, ``[rows of this rank, *rest]``.

    Raises:
        ValueError: Adasum or an unknown op (on every rank).
        CollectiveArgumentError: a 0-d tensor (Horovod's "Process-set rank zero tried to
            REDUCESCATTER a rank-zero tensor.", on every rank); and as
            :func:`~collectives.framework.horovod.grouped_allreduce`.
    """
    return _reducescatter(tensors, name, compression, op, process_set, prescale_factor,
                          postscale_factor, "grouped_reducescatter")


def _reducescatter(tensors, name, compression, op, process_set, prescale_factor,
                   postscale_factor, what: str) -> list:
    call = Call(process_set, what)
    with call.checking():
        op = checked_op(op, what)
        if op == Adasum:
            raise ValueError(f"hvd.{what}: op must be hvd.Sum, Average, Min, Max or Product "
                             "(Horovod's reducescatter has no Adasum)")
        compressed = [compression.compress(t) for t in tensors]
        pairs = [to_array(c) for c, _ in compressed]
        for _, like in pairs:
            reduction_check(like, what)
        arrays = [supported(a, what) for a, _ in pairs]
        reduction_dtypes(arrays, op, what)
        pre = factor(prescale_factor, what, "prescale_factor")
        post = factor(postscale_factor, what, "postscale_factor")
    sig = Signature("reducescatter", {"op": op, "prescale_factor": pre,
                                      "postscale_factor": post, "name": name,
                                      "process_set": process_set.process_set_id},
                    [(a.dtype.name, a.shape) for a in arrays])
    with call.lock:
        agreed = call.agree(sig)
        refuse_scalars(agreed.signature, "REDUCESCATTER")
        results = _reducescatter_data(call, sig, arrays)
    return [compression.decompress(from_array(r, like), ctx)
            for r, (_, like), (_, ctx) in zip(results, pairs, compressed)]


def reducescatter(tensor, name: str | None = None, compression=Compression.none, op=Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0):
    """:func:`grouped_reducescatter` of one tensor (horovod.torch's positional order)."""
    return _reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                          postscale_factor, "reducescatter")[0]
