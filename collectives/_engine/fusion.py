"""Tensor fusion: a nest of arrays moves as few fused buffers per dtype.

A collective called on a nest (list, tuple or dict of arrays, nested) packs the nest's
arrays of one dtype into 1-D buffers of at most ``limit`` bytes each (``0``: one buffer per
dtype; an array larger than the limit goes alone), runs the collective once per buffer, and
unpacks each buffer's result into per-array results. Buffers are laid out so that every
array's result is bit for bit the result of calling the op on that array alone:

* ``elementwise`` (all-reduce, broadcast): the arrays' elements one after the other;
* ``all_gather``: the same; the gathered ``[k, N]`` is cut into ``[k, *shape]`` per array;
* ``reduce_scatter``: member p's chunk of every array side by side, chunk by chunk (each
  array zero-padded to ``k * ceil(n / k)`` as alone), so member p's ``ceil(N / k)`` elements
  of the fused buffer are its chunks of the arrays;
* ``all_to_all``: block q of every array (split along the split dimension) side by side,
  block by block, exchanged along dimension 0; each array's received blocks are
  concatenated along the concat dimension in sender order, as alone.

Which buffers (a :class:`Fusion`) is fixed by the arrays' dtypes and shapes, the group size
and the limit (:func:`fusion`). The limits are
``IPUConfig.optimizations.maximum_cross_replica_sum_buffer_size`` and
``maximum_reduce_scatter_buffer_size`` (seed 004:1822-1829): GCL runs one collective per
fused buffer, so the engine records (and the cost model charges) one call per buffer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

#: the ways an op lays out a fused buffer (see the module docstring)
LAYOUTS = ("elementwise", "all_gather", "reduce_scatter", "all_to_all")

#: ``(dtype, shape)`` of every array of a nest, in nest order
NestShapes = tuple[tuple[np.dtype, tuple[int, ...]], ...]


@dataclass(frozen=True)
class FusionLimits:
    """The most bytes of one fused buffer; 0: one buffer per dtype.

    Attributes:
        cross_replica_sum_bytes: for the all-reduces (``cross_replica_sum/mean/reduce``) and
            the data-movement ops (``all_gather``, ``all_to_all``, ``broadcast``: the seeds
            name no limit for them; ipupod applies the all-reduce's).
        reduce_scatter_bytes: for ``reduce_scatter``.
    """

    cross_replica_sum_bytes: int = 0
    reduce_scatter_bytes: int = 0

    def __post_init__(self):
        for name in ("cross_replica_sum_bytes", "reduce_scatter_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"FusionLimits.{name} must be an int >= 0, got {value!r}")

    def for_layout(self, layout: str) -> int:
        return self.reduce_scatter_bytes if layout == "reduce_scatter" else \
            self.cross_replica_sum_bytes


@dataclass(frozen=True)
class Bucket:
    """One fused buffer: arrays ``indices`` of the nest, of one dtype.

    Attributes:
        dtype: the arrays' dtype.
        indices: the arrays' positions in the nest.
        shapes: their shapes.
        sizes: elements each array contributes per member (``elementwise``, ``all_gather``:
            all of it; ``reduce_scatter``: its chunk ``ceil(n / k)``; ``all_to_all``: one
            block).
        offsets: where each array's part starts in a member's stretch of the buffer.
        length: elements of the fused buffer.
    """

    dtype: np.dtype
    indices: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    length: int


@dataclass(frozen=True)
class Fusion:
    """The fused buffers of a nest, and its fingerprint (shared in every buffer's
    descriptor, so replicas whose nests differ raise instead of mixing arrays)."""

    buckets: tuple[Bucket, ...]
    fingerprint: str


def _per_member(layout: str, shape: tuple[int, ...], k: int) -> int:
    n = int(np.prod(shape, dtype=np.int64))
    if layout == "reduce_scatter":
        return -(-n // k)
    if layout == "all_to_all":
        return n // k
    return n


@lru_cache(maxsize=512)
def fusion(shapes: NestShapes, layout: str, k: int, limit_bytes: int,
           split_dimension: int = 0) -> Fusion:
    """The buckets of a nest: by dtype in order of first appearance, arrays in nest order,
    a new bucket when the next array would take the bucket past ``limit_bytes`` (0: no
    limit). Bytes count the input arrays."""
    by_dtype: dict[np.dtype, list[list[int]]] = {}
    filled: dict[np.dtype, int] = {}
    for i, (dtype, shape) in enumerate(shapes):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        groups = by_dtype.setdefault(dtype, [[]])
        if limit_bytes and groups[-1] and filled[dtype] + nbytes > limit_bytes:
            groups.append([])
            filled[dtype] = 0
        groups[-1].append(i)
        filled[dtype] = filled.get(dtype, 0) + nbytes
    buckets = []
    for dtype, groups in by_dtype.items():
        for indices in groups:
            mine = tuple(shapes[i][1] for i in indices)
            sizes = tuple(_per_member(layout, s, k) for s in mine)
            offsets = tuple(int(x) for x in np.cumsum((0,) + sizes[:-1]))
            stretch = sum(sizes)
            length = stretch * k if layout in ("reduce_scatter", "all_to_all") else stretch
            buckets.append(Bucket(dtype, tuple(indices), mine, sizes, offsets, length))
    text = repr([(d.str, s) for d, s in shapes]) + f"|{layout}|{k}|{limit_bytes}"
    fingerprint = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    return Fusion(tuple(buckets), fingerprint)


def pack(bucket: Bucket, arrays: Sequence[np.ndarray], layout: str, k: int,
         split_dimension: int = 0) -> np.ndarray:
    """The fused 1-D buffer of ``bucket`` from the nest's ``arrays``."""
    mine = [arrays[i] for i in bucket.indices]
    if layout in ("elementwise", "all_gather"):
        if len(mine) == 1:
            return np.ascontiguousarray(mine[0]).reshape(-1)
        return np.concatenate([np.ravel(a) for a in mine])
    stretch = bucket.length // k
    out = np.zeros((k, stretch), bucket.dtype)
    for a, size, at in zip(mine, bucket.sizes, bucket.offsets):
        if layout == "reduce_scatter":  # zero-padded to k chunks, as alone
            if a.size < k * size:
                a = np.concatenate([a, np.zeros(k * size - a.size, a.dtype)])
            out[:, at:at + size] = a.reshape(k, size)
        else:  # all_to_all: block q of the array (along split_dimension) in row q
            s = split_dimension
            split = a.reshape(a.shape[:s] + (k, a.shape[s] // k) + a.shape[s + 1:])
            out[:, at:at + size] = np.moveaxis(split, s, 0).reshape(k, size)
    return out.reshape(-1)


def unpack(bucket: Bucket, result: np.ndarray, layout: str, k: int,
           concat_dimension: int = 0, split_dimension: int = 0) -> list[np.ndarray]:
    """Per array of ``bucket``, the result it would get alone (new arrays)."""
    if layout == "elementwise":
        if len(bucket.indices) == 1:
            return [result.reshape(bucket.shapes[0])]
        return [result[at:at + n].reshape(shape)
                for shape, n, at in zip(bucket.shapes, bucket.sizes, bucket.offsets)]
    if layout == "all_gather":
        rows = result.reshape(k, -1)
        return [np.ascontiguousarray(rows[:, at:at + n]).reshape((k, *shape))
                for shape, n, at in zip(bucket.shapes, bucket.sizes, bucket.offsets)]
    if layout == "reduce_scatter":
        return [result[at:at + n] for n, at in zip(bucket.sizes, bucket.offsets)]
    rows = result.reshape(k, -1)  # all_to_all: row s came from the member at position s
    out = []
    s, d = split_dimension, concat_dimension
    for shape, n, at in zip(bucket.shapes, bucket.sizes, bucket.offsets):
        block = shape[:s] + (shape[s] // k,) + shape[s + 1:]
        out.append(np.concatenate([rows[q, at:at + n].reshape(block) for q in range(k)],
                                  axis=d))
    return out


def fused_per_dtype(arrays: Sequence[np.ndarray],
                    call: Callable[[np.ndarray, np.dtype], np.ndarray]) -> list[np.ndarray]:
    """``call(flat, dtype)`` once per dtype on the concatenation (in list order) of the
    arrays of that dtype; returns the arrays' parts of the results, in the arrays' shapes
    (views of the result buffers). The strategies' gradient sum uses it; Horovod's tensor
    fusion (collectives.framework.horovod) uses :func:`grouped_per_dtype` without the packing; the
    ops' nests use :func:`plan`/:func:`pack`/:func:`unpack`, which also bound the buffers
    and lay out scatter-like ops."""
    return grouped_per_dtype(arrays, lambda group, dtype: call(
        np.ascontiguousarray(group[0]).reshape(-1) if len(group) == 1 else
        np.concatenate([a.reshape(-1) for a in group]), dtype))


def grouped_per_dtype(arrays: Sequence[np.ndarray],
                      call: Callable[[list, np.dtype], np.ndarray]) -> list[np.ndarray]:
    """``call(group, dtype)`` once per dtype on the list of the arrays of that dtype (in
    list order), which returns the 1-D result of their concatenation (packed or not: the
    caller's choice); returns the arrays' parts of the results, in the arrays' shapes
    (views of the result buffers)."""
    out: list = [None] * len(arrays)
    by_dtype: dict = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        total = call([arrays[i] for i in idx], dtype)
        pos = 0
        for i in idx:
            n = arrays[i].size
            out[i] = total[pos:pos + n].reshape(arrays[i].shape)
            pos += n
    return out
