"""Running a function on every local replica of a model, and the gradient reduction over
every replica of the job.

* :class:`JobRunner` (a training model with replicas across the job): the replicas run
  through ``collectives.strategies.IPUMultiReplicaStrategy.run``, one thread per local
  replica in its replica context, and :meth:`JobRunner.reduce` is
  ``collectives.cross_replica_sum``: local replicas combine in shared memory, instances
  exchange over the job's transport, in GCL's canonical tree order over global replica
  indices (bit-identical at every layout of the replicas over instances).
* :class:`LocalRunner` (one replica in the job, or inference): the replicas run in threads
  of their own (none for one replica) and nothing is reduced.

Each replica runs with the intra-op thread count of :mod:`poptorch._threads`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import torch

from poptorch._threads import torch_threads

__all__ = ["Runner", "LocalRunner", "JobRunner"]


class Runner:
    """Runs ``fn(local_replica_index)`` on every local replica; results in local order."""

    num_replicas: int
    threads: int

    def run(self, fn: Callable[[int], Any]) -> list:
        raise NotImplementedError

    def reduce(self, tensors: list[torch.Tensor], name: str) -> list[torch.Tensor]:
        """The sum of ``tensors`` over every replica of the job (call inside ``run``): tensors
        this replica owns (its inputs, or new ones), which the caller may change in place."""
        return tensors

    def close(self) -> None:
        pass


class LocalRunner(Runner):
    """Replicas that do not communicate."""

    def __init__(self, num_replicas: int, threads: int):
        self.num_replicas, self.threads = num_replicas, threads
        self._pool = (ThreadPoolExecutor(num_replicas, thread_name_prefix="poptorch-replica")
                      if num_replicas > 1 else None)

    def run(self, fn: Callable[[int], Any]) -> list:
        if self._pool is None:
            with torch_threads(self.threads):
                return [fn(0)]

        def in_thread(r: int) -> Any:
            with torch_threads(self.threads):
                return fn(r)
        futures = [self._pool.submit(in_thread, r) for r in range(self.num_replicas)]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class JobRunner(Runner):
    """Replicas of the configured ``ipu_node`` system that reduce through the collectives.

    Args:
        threads: intra-op threads of each replica.
    """

    def __init__(self, threads: int):
        from collectives.strategies import IPUMultiReplicaStrategy, PerReplica
        self._strategy = IPUMultiReplicaStrategy()
        self._per_replica = PerReplica
        self.num_replicas = self._strategy.num_local_replicas
        self.threads = threads

    def run(self, fn: Callable[[int], Any]) -> list:
        def in_replica(r: int) -> Any:
            with torch_threads(self.threads):
                return fn(r)
        indices = self._per_replica(list(range(self.num_replicas)))
        return self._strategy.run(in_replica, args=(indices,))

    def reduce(self, tensors: list[torch.Tensor], name: str) -> list[torch.Tensor]:
        """``cross_replica_sum`` of the list: the collectives fuse it into few buffers per
        dtype (their nest path), one plan per buffer and ``name``; the caller's name is the
        same at every step, so those plans serve the life of the model."""
        from collectives import cross_replica_sum
        arrays = [t.detach().numpy() for t in tensors]
        summed = cross_replica_sum(arrays, name=name)
        return [torch.from_numpy(np.asarray(a)) for a in summed]
