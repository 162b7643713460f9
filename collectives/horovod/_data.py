"""The data movement of the Horovod collectives on a process set's communicator.

Reductions keep ipupod's canonical order: each member owns a contiguous chunk of the fused
buffer, receives every member's piece of it (all-to-all), combines the pieces in the tree
order over process-set positions (:mod:`collectives.tree`), and an all-gather returns the
chunks: the traffic of a ring allreduce, and bit-identical results on every member.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.horovod._wire import patience_for
from collectives.operators import CollectiveOperator, combine_into
from collectives.tree import tree_reduce

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


def _parts(arrays: Sequence[np.ndarray], lo: int, hi: int) -> list[np.ndarray]:
    """Elements ``[lo, hi)`` of the arrays' concatenation, as views of the arrays (1-D)."""
    out, at = [], 0
    for a in arrays:
        n = a.size
        if at + n > lo and at < hi:
            out.append(a.reshape(-1)[max(lo - at, 0):min(hi, at + n) - at])
        at += n
        if at >= hi:
            break
    return out


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

    Each member's chunk of the concatenation (Horovod's uneven split) travels from and is
    reduced out of the arrays themselves (the transport's ``alltoallv_parts``), straight
    into its place in the result, scaled there (1/P of the elements per member), and an
    in-place all-gather completes the result.
    """
    dtype = arrays[0].dtype
    n = sum(a.size for a in arrays)
    if comm is None or n == 0:
        whole = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else \
            np.zeros(0, dtype)
        _scale_into(whole, postscale)
        return whole
    P, me, item = comm.size, comm.rank, dtype.itemsize
    counts = split_counts(n, P)
    at = [sum(counts[:j]) for j in range(P + 1)]
    mine = counts[me]
    recv = np.empty((P - 1) * mine, dtype)
    rows = {j: recv[(j - (j > me)) * mine:(j - (j > me) + 1) * mine]
            for j in range(P) if j != me}
    own = _parts(arrays, at[me], at[me + 1])
    sizes = [p.size for p in own]
    offsets = [sum(sizes[:k]) for k in range(len(sizes) + 1)]

    def split(row):
        return [row[offsets[k]:offsets[k + 1]].view(np.uint8) for k in range(len(sizes))]

    send_parts = [[] if j == me else [p.view(np.uint8) for p in _parts(arrays, at[j], at[j + 1])]
                  for j in range(P)]
    recv_parts = [[] if j == me else split(rows[j]) for j in range(P)]
    comm.alltoallv_parts(send_parts, recv_parts,
                         patience_for(engine, "hvd.allreduce", members, True))
    whole = np.empty(n, dtype)
    combine, owned = _combiner(op), [j != me for j in range(P)]
    for k, part in enumerate(own):  # this member's chunk, reduced straight into its place
        lo, hi = offsets[k], offsets[k + 1]
        pieces = [part if j == me else rows[j][lo:hi] for j in range(P)]
        tree_reduce(pieces, combine, owned, out=whole[at[me] + lo:at[me] + hi])
    _scale_into(whole[at[me]:at[me + 1]], postscale)
    got = comm.allgatherv_into(whole.view(np.uint8), [c * item for c in counts],
                               patience_for(engine, "hvd.allreduce", members, True))
    if not np.shares_memory(got, whole):  # (a transport that returned a new buffer)
        whole[...] = np.frombuffer(np.asarray(got, np.uint8)[:whole.nbytes], dtype)
    return whole


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
    got = comm.allgatherv(np.ascontiguousarray(send, np.uint8), counts,
                          patience_for(engine, "hvd.allgather", members, True))
    return np.asarray(got, np.uint8)[:sum(counts)]


def alltoall_bytes(engine, comm, members, send: np.ndarray, send_counts: list[int],
                   recv_counts: list[int]) -> np.ndarray:
    """Member j gets ``send_counts[j]`` bytes of ``send`` (in order); returns what this
    member received, concatenated in member order."""
    if comm is None:
        return send.copy()
    got = comm.alltoallv(np.ascontiguousarray(send, np.uint8), send_counts, recv_counts,
                         patience_for(engine, "hvd.alltoall", members, True))
    return np.asarray(got, np.uint8)[:sum(recv_counts)].copy()


def broadcast_bytes(engine, comm, members, data: np.ndarray, root: int) -> np.ndarray:
    """Member ``root``'s bytes on every member (``data`` the same length everywhere)."""
    if comm is None:
        return data.copy()
    got = comm.broadcast(np.ascontiguousarray(data, np.uint8).copy(), root,
                         patience_for(engine, "hvd.broadcast", members, True))
    return np.asarray(got, np.uint8)[:data.nbytes].copy()


def reduce_pieces(pieces: list[np.ndarray], op: str) -> np.ndarray:
    """Combine per-member pieces (member order) in the canonical tree order."""
    return np.asarray(tree_reduce(pieces, _combiner(op)))
