"""The data movement of the Horovod collectives on a process set's communicator.

Reductions keep ipupod's canonical order and are the GCL all-reduce's exchange
(:class:`collectives._engine.exchange.Exchange`): each member owns a contiguous chunk of the fused
buffer, receives every member's piece of it (all-to-all), combines the pieces in the tree
order over process-set positions (:mod:`collectives._engine.tree`), scales its chunk, and an
all-gather returns the chunks: the traffic of a ring allreduce, and bit-identical results
on every member.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._engine.exchange import Exchange, Scratch, tree_reduce
from collectives.framework.horovod._request import patience_for
from collectives.operators import CollectiveOperator, combine_into

#: Horovod's reduction ops (``hvd.Sum`` ...) as ipupod operators
OPERATORS = {"Sum": CollectiveOperator.ADD, "Average": CollectiveOperator.ADD,
             "Min": CollectiveOperator.MIN, "Max": CollectiveOperator.MAX,
             "Product": CollectiveOperator.MUL}


def split_counts(n: int, parts: int) -> list[int]:
    """Horovod's uneven split of ``n`` over ``parts``: the first ``n % parts`` get one more."""
    base, extra = divmod(n, parts)
    return [base + (1 if j < extra else 0) for j in range(parts)]


def scale(arr: np.ndarray, factor: float) -> np.ndarray:
    """``arr * factor`` as Horovod's CPU ``ScaleBuffer`` computes it: float16 through float32
    and rounded back, float32 with the factor cast to float32, float64 in double, integers
    in double then converted back by truncation toward zero (C++ conversion). A factor of
    exactly 1.0 is skipped (as Horovod does). Returns a new array or ``arr``."""
    if factor == 1.0:
        return arr
    dt = arr.dtype
    if dt == np.float16:
        return (arr.astype(np.float32) * np.float32(factor)).astype(np.float16)
    if dt == np.float32:
        return arr * np.float32(factor)
    if dt == np.float64:
        return arr * np.float64(factor)
    return np.trunc(arr.astype(np.float64) * factor).astype(dt)


def _combiner(op: str):
    if op == "Adasum":
        return _adasum
    operator = OPERATORS[op]
    return lambda a, b, out: combine_into(operator, a, b, out)


def _adasum(a: np.ndarray, b: np.ndarray, out=None) -> np.ndarray:
    """Adasum of two gradients (Maleki et al., as Horovod): ``(1 - a.b / 2|a|^2) a +
    (1 - a.b / 2|b|^2) b``, dot products in float64; a zero vector's coefficient is 1."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot, na, nb = float(a64 @ b64), float(a64 @ a64), float(b64 @ b64)
    ca = 1.0 - dot / (2.0 * na) if na > 0 else 1.0
    cb = 1.0 - dot / (2.0 * nb) if nb > 0 else 1.0
    return (ca * a64 + cb * b64).astype(a.dtype).reshape(a.shape)


def _scale_into(chunk: np.ndarray, factor: float) -> None:
    """``chunk`` scaled as :func:`scale`, in place (same bytes)."""
    if factor == 1.0:
        return
    if chunk.dtype in (np.float32, np.float64):
        np.multiply(chunk, chunk.dtype.type(factor), out=chunk)
    else:
        chunk[...] = scale(chunk, factor)


def allreduce_group(engine, comm, members: Sequence[int], arrays: Sequence[np.ndarray],
                    op: str, postscale: float = 1.0) -> np.ndarray:
    """Reduce the concatenation of ``arrays`` (contiguous, one dtype) over ``comm`` with
    ``op`` (Sum/Min/Max/Product; Average reduces as Sum), times ``postscale`` (as
    :func:`scale`). Returns one new 1-D array: the arrays' results one after the other.

    The concatenation is the GCL all-reduce's one partial: its exchange
    (:class:`~collectives._engine.exchange.Exchange`) scales each member's reduced chunk in its
    place (1/P of the elements per member) before the all-gather completes the result.
    """
    dtype = arrays[0].dtype
    whole = np.concatenate([a.reshape(-1) for a in arrays]) if len(arrays) != 1 else \
        np.ascontiguousarray(arrays[0]).reshape(-1)
    if comm is None or whole.size == 0:
        whole = whole.copy() if len(arrays) == 1 else whole
        _scale_into(whole, postscale)
        return whole
    exchange = Exchange(Scratch(), comm, patience_for(engine, "hvd.allreduce", members, True),
                        [whole.size], dtype, OPERATORS[op], True,
                        finish_chunk=lambda chunk: _scale_into(chunk, postscale))
    return exchange.finish(exchange.start([whole]))[0]


def adasum_tensors(engine, comm, members, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Adasum of each tensor over ``comm`` (per-tensor dot products, so the whole tensors
    travel: an all-gather, then the tree of pairwise Adasum combinations on every member)."""
    if comm is None:
        return [a.copy() for a in arrays]
    out = []
    for a in arrays:
        flat = np.ascontiguousarray(a).ravel()
        rows = allgather_bytes(engine, comm, members, flat.view(np.uint8),
                               [flat.nbytes] * comm.size)
        parts = list(np.frombuffer(rows, a.dtype).reshape(comm.size, flat.size))
        out.append(np.asarray(tree_reduce(parts, _adasum)).reshape(a.shape).copy())
    return out


def allgather_bytes(engine, comm, members, send: np.ndarray, counts: list[int]) -> np.ndarray:
    """Every member's bytes (``counts[j]`` from member j), concatenated, as uint8."""
    if comm is None:
        return send.copy()
    got = np.empty(sum(counts), np.uint8)
    comm.allgatherv(np.ascontiguousarray(send, np.uint8), got, counts,
                    patience_for(engine, "hvd.allgather", members, True)).wait()
    return got


def alltoall_bytes(engine, comm, members, send: np.ndarray, send_counts: list[int],
                   recv_counts: list[int]) -> np.ndarray:
    """Member j gets ``send_counts[j]`` bytes of ``send`` (in order); returns what this
    member received, concatenated in member order."""
    if comm is None:
        return send.copy()
    got = np.empty(sum(recv_counts), np.uint8)
    comm.alltoallv(np.ascontiguousarray(send, np.uint8), send_counts, got, recv_counts,
                   patience_for(engine, "hvd.alltoall", members, True)).wait()
    return got


def broadcast_bytes(engine, comm, members, data: np.ndarray, root: int) -> np.ndarray:
    """Member ``root``'s bytes on every member (``data`` the same length everywhere)."""
    if comm is None:
        return data.copy()
    got = np.ascontiguousarray(data, np.uint8).copy()
    comm.broadcast(got, root, patience_for(engine, "hvd.broadcast", members, True)).wait()
    return got


def reduce_pieces(pieces: list[np.ndarray], op: str) -> np.ndarray:
    """Combine per-member pieces (member order) in the canonical tree order."""
    return np.asarray(tree_reduce(pieces, _combiner(op)))
