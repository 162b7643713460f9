"""Intra-op threads of a replica: chosen so that results do not depend on the layout.

CPU PyTorch's results depend on how many intra-op threads an op runs with: reductions and
matrix products cut their work by thread count, and the partial sums then add up in another
order (measured here with torch 2.13: the weight gradient of a 512x512 linear layer differs
between 1 and 2 threads; the same count gives the same bits). So every replica computes with
the same count, **T**, whatever the layout of the job's replicas over instances:

    T = IPUPOD_TORCH_THREADS if set, else max(1, D // global replicas)

where D is PyTorch's intra-op thread count of the process when ``poptorch`` is imported
(``torch.get_num_threads()``: the number of cores, or ``OMP_NUM_THREADS``). ``python prog.py``
with ``replicationFactor(4)`` and ``poprun -n 2 --num-replicas 4`` or ``-n 4`` give every
replica the same T on one machine, so the same bits; across machines of different core counts,
set ``IPUPOD_TORCH_THREADS`` to one value everywhere. The replicas of one instance run
concurrently, each in its own thread with T threads (the cores are shared as among the
instances of a poprun job), and the caller's own count comes back after the call.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

__all__ = ["THREADS_ENV", "threads_per_replica", "torch_threads"]

#: environment variable fixing the intra-op threads of every replica
THREADS_ENV = "IPUPOD_TORCH_THREADS"
_DEFAULT_THREADS = torch.get_num_threads()


def threads_per_replica(global_replicas: int) -> int:
    """T for a model of ``global_replicas`` replicas (module docstring).

    Raises:
        ValueError: ``IPUPOD_TORCH_THREADS`` is not an integer >= 1.
    """
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{THREADS_ENV}={raw!r}: must be an integer >= 1")
        return value
    return max(1, _DEFAULT_THREADS // max(1, global_replicas))


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the body with ``count`` intra-op threads in this thread, then restore."""
    previous = torch.get_num_threads()
    if previous != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
