"""Fusion of a list of arrays per dtype: one flat buffer per dtype, one call on it, the
result split back to the arrays' shapes (Horovod's tensor fusion; the gradient allreduce of
the strategies)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def fused_per_dtype(arrays: Sequence[np.ndarray],
                    call: Callable[[np.ndarray, np.dtype], np.ndarray]) -> list[np.ndarray]:
    """``call(flat, dtype)`` once per dtype on the concatenation (in list order) of the
    arrays of that dtype; returns the arrays' parts of the results, in the arrays' shapes
    (views of the result buffers)."""
    out: list = [None] * len(arrays)
    by_dtype: dict = {}
    for i, a in enumerate(arrays):
        by_dtype.setdefault(a.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        flat = (np.ascontiguousarray(arrays[idx[0]]).reshape(-1) if len(idx) == 1 else
                np.concatenate([arrays[i].reshape(-1) for i in idx]))
        total = call(flat, dtype)
        pos = 0
        for i in idx:
            n = arrays[i].size
            out[i] = total[pos:pos + n].reshape(arrays[i].shape)
            pos += n
    return out
