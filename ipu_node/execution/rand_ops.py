"""``ipu_node.rand_ops``: the replicas' random streams (TF-IPU's ``rand_ops``, seed
004:5338-5359, and the seed that ``utils.reset_ipu_seed`` sets, seed 004:714-729).

Each replica draws from its own numpy ``Generator``: :func:`generator` inside a replica
function. After ``utils.reset_ipu_seed(seed)`` global replica ``r`` draws from
``numpy.random.default_rng([seed, r])``; with ``experimental_identical_replicas=True`` every
replica draws from ``default_rng([seed])``. The stream depends on the seed and the global
replica index only, so it is the same at every layout of the replicas over instances (1x8,
2x4, 8x1) and every transport; for identical replicas across processes, every instance must
pass the same seed, as the seed says. Before any ``reset_ipu_seed`` the seed comes from the
OS (TF-IPU seeds the IPUs nondeterministically too).

Outside a replica function :func:`generator` is replica 0's of 1 (``ipu_compiler.compile``
without a strategy runs there too).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ipu_node.runtime.replica import current_replica_context

__all__ = ["reset_seed", "generator", "dropout"]

_lock = threading.Lock()
_seed: list = [None, False]            # seed (None: from the OS), identical replicas
_streams: dict[int, np.random.Generator] = {}


def reset_seed(seed: int, identical_replicas: bool = False) -> None:
    """Restart every replica's stream from ``seed`` (module docstring).

    Raises:
        TypeError: ``seed`` is not an int.
        ValueError: ``seed`` is negative.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"reset_ipu_seed: seed must be an int, not {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"reset_ipu_seed: seed must be >= 0, got {seed}")
    with _lock:
        _seed[0], _seed[1] = int(seed), bool(identical_replicas)
        _streams.clear()


def stream_seed(replica_index: int) -> list[int] | None:
    """The entropy of global replica ``replica_index``'s stream (None: from the OS)."""
    seed, identical = _seed
    if seed is None:
        return None
    return [seed] if identical else [seed, replica_index]


def generator() -> np.random.Generator:
    """The calling replica's random stream (module docstring)."""
    ctx = current_replica_context()
    replica = 0 if ctx is None else ctx.replica_index
    with _lock:
        rng = _streams.get(replica)
        if rng is None:
            entropy = stream_seed(replica)
            if entropy is None:  # one OS seed per process, each replica its own stream
                _seed[0] = int(np.random.SeedSequence().entropy % (2**63))
                entropy = stream_seed(replica)
            rng = _streams[replica] = np.random.default_rng(entropy)
    return rng


def dropout(x: Any, rate: float = 0.5, noise_shape=None, seed: int | None = None,
            name: str | None = None) -> np.ndarray:
    """Zero each element of ``x`` with probability ``rate`` and scale the rest by
    ``1 / (1 - rate)`` (seed 004:5338-5359), drawing from the replica's stream (or from
    ``default_rng([seed, replica])`` when ``seed`` is given).

    Args:
        x: array-like, any shape; the result has its shape and dtype.
        rate: probability of dropping, in [0, 1).
        noise_shape: the mask's shape, broadcast against ``x`` (default ``x.shape``).

    Raises:
        ValueError: ``rate`` outside [0, 1).
    """
    arr = np.asarray(x)
    if not 0 <= rate < 1:
        raise ValueError(f"dropout: rate must be in [0, 1), got {rate!r}")
    if seed is None:
        rng = generator()
    else:
        ctx = current_replica_context()
        rng = np.random.default_rng([int(seed), 0 if ctx is None else ctx.replica_index])
    keep = rng.random(arr.shape if noise_shape is None else tuple(noise_shape)) >= rate
    return (arr * keep / (1 - rate)).astype(arr.dtype, copy=False)
