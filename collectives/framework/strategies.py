"""Distribution strategies: run a step function on every replica of the job.

One base, :class:`IPUStrategyBase`, and the seeds' strategies on it (seed 004:1957-2204):

* ``IPUMultiReplicaStrategy`` (seed 004:2188-2204) and ``PopDistStrategy`` (its TF2 name):
  GCL collectives between the replicas of a poprun job; a host broadcast of initial values
  from the first instance to all (the role Horovod plays there).
* ``IPUStrategy``: one instance and its local replicas.
* ``IPUMultiWorkerStrategy(cluster_resolver)``: the workers of a TF_CONFIG cluster over the
  gRPC transport (seed 004:1957-2067).
* ``IPUHorovodStrategy()``: the processes of an mpirun job, through
  :mod:`collectives.framework.horovod` (seed 004:2130-2187).

All have ``scope()``, ``run``/``experimental_run_v2``, ``reduce``, ``broadcast`` and
``update_ipu_config``, and the variable semantics of seed 004:1962-1977 through
:func:`Variable` (see :mod:`collectives.framework.distributed_variables`): inside ``scope()``, every
optimizer's ``apply_gradients`` sums the gradients of mirrored variables over the job.

As in TF-IPU, a strategy may be made before the IPU system is configured (the seeds'
multi-worker examples configure it last, seed 004:2056-2058); it finds the system when it
first needs it, and running before then raises ``NotConfiguredError`` naming
``configure_ipu_system``. ``IPUMultiWorkerStrategy`` and ``IPUHorovodStrategy`` made first
fill in the job's distribution (TF_CONFIG's workers, the mpirun ranks) when the program
configures a system without one. When the program did not set ``ipus_per_replica``, the
first run derives it from the pipeline's shards (:func:`ipu_node.system.widen_replicas`): a
pipeline of two stages on a device of two IPUs is one replica of two IPUs, as TF-IPU
derives the replication factor.
"""

from __future__ import annotations

import numpy as np
from ipu_node.env import mpi_world

from collectives.framework import horovod as hvd
from collectives.framework.distributed_variables import (
    MirroredVariable, SyncOnReadVariable, VariableAggregation, VariableSynchronization)
from collectives.framework.strategy_base import (IPUStrategyBase, PerReplica, ReduceOp,
                                                 ValueContext, get_strategy)

__all__ = ["IPUStrategyBase", "IPUStrategy", "IPUMultiReplicaStrategy", "PopDistStrategy",
           "IPUMultiWorkerStrategy", "IPUHorovodStrategy", "ReduceOp", "PerReplica",
           "ValueContext", "get_strategy", "VariableSynchronization", "VariableAggregation",
           "MirroredVariable", "SyncOnReadVariable"]


class IPUMultiReplicaStrategy(IPUStrategyBase):
    """TF-IPU's strategy for PopDist/poprun jobs (seed 004:2188-2204): GCL reductions over
    every replica of the job.

    Args:
        ipu_device: only ``"/device:IPU:0"``.
        add_ipu_cross_replica_reductions: kept for API compatibility (reductions are
            explicit, or implicit in ``apply_gradients`` under ``scope()``).
        variables_on_host: see :class:`IPUStrategyBase`.
    """

    def __init__(self, ipu_device: str = "/device:IPU:0",
                 add_ipu_cross_replica_reductions: bool = True,
                 variables_on_host: bool = False):
        super().__init__(ipu_device, variables_on_host)


class PopDistStrategy(IPUMultiReplicaStrategy):
    """The TF2 API's popdist-driven strategy: :class:`IPUMultiReplicaStrategy` under its
    later name (anchors §4.1: "IPUMultiWorkerStrategy will be deprecated in favour of
    PopDistStrategy")."""


class IPUStrategy(IPUStrategyBase):
    """The replicas of one instance (no other instances).

    Raises:
        ValueError: the configured system belongs to a multi-instance job (use
            :class:`PopDistStrategy`, :class:`IPUMultiWorkerStrategy` or
            :class:`IPUHorovodStrategy`).
    """

    def _check_system(self, system) -> None:
        super()._check_system(system)
        if system.process_count > 1:
            raise ValueError(f"IPUStrategy runs one instance, but this one is instance "
                             f"{system.process_index} of {system.process_count}")


class IPUMultiWorkerStrategy(IPUStrategyBase):
    """Synchronous training on the workers of a TF_CONFIG cluster (seed 004:1957-2067), over
    the gRPC transport that ``popdist.set_ipu_config`` configures from TF_CONFIG.

    Args:
        cluster_resolver: a ``TFConfigClusterResolver`` (``cluster_spec()``, ``task_type``,
            ``task_id``); its chief and worker tasks are the instances (ps and evaluator
            tasks are counted by TF but train nothing).
        ipu_device, variables_on_host: see :class:`IPUStrategyBase`.

    Raises:
        ValueError: the resolver's cluster does not match the configured system (worker
            count, this task's place).
    """

    def __init__(self, cluster_resolver, ipu_device: str = "/device:IPU:0",
                 variables_on_host: bool = False):
        self.cluster_resolver = cluster_resolver
        super().__init__(ipu_device, variables_on_host)

    def _distribute(self, config) -> None:
        """TF_CONFIG's workers, through the resolver (poprun's ``TFConfigClusterResolver``
        fills in the grpc transport and the coordinator, as ``popdist.set_ipu_config``)."""
        mrd = config.experimental.multi_replica_distribution
        fill = getattr(self.cluster_resolver, "update_ipu_config", None)
        if mrd.process_count == 0 and fill is not None:
            fill(config)

    def _check_system(self, system) -> None:
        super()._check_system(system)
        spec = self.cluster_resolver.cluster_spec().as_dict()
        workers = spec.get("chief", []) + spec.get("worker", [])
        task_type, task_id = self.cluster_resolver.task_type, self.cluster_resolver.task_id
        index = task_id if task_type == "chief" else len(spec.get("chief", [])) + task_id
        if len(workers) != system.process_count or index != system.process_index:
            raise ValueError(
                f"the cluster resolver's cluster ({len(workers)} workers, this task "
                f"{task_type}:{task_id} = instance {index}) does not match the configured IPU "
                f"system (instance {system.process_index} of {system.process_count}): "
                "configure it with popdist.set_ipu_config(cfg) under the same TF_CONFIG")

    def update_config_proto(self, config_proto):
        """TF1's session-config hook (seed 004:1994): nothing to add in ipupod; returns it."""
        return config_proto


class IPUHorovodStrategy(IPUStrategyBase):
    """Synchronous training on the processes of an mpirun job through
    :mod:`collectives.framework.horovod` (seed 004:2130-2187): no cluster resolver, no server; host
    reductions are ``hvd.allreduce`` and the initial broadcast ``hvd.broadcast(root_rank=0)``.

    Args:
        ipu_device, variables_on_host: see :class:`IPUStrategyBase`.
    """

    def __init__(self, ipu_device: str = "/device:IPU:0", variables_on_host: bool = False):
        hvd.init()  # configures one IPU per process when the program has not (yet)
        super().__init__(ipu_device, variables_on_host)

    def _distribute(self, config) -> None:
        """The ranks of plain ``mpirun`` (its rank and size variables), over MPI: a program
        that configures its own system after making the strategy (seed 004:2176-2178) gets
        the job's processes, as ``hvd.init()`` does."""
        mrd = config.experimental.multi_replica_distribution
        world = mpi_world()
        if mrd.process_count == 0 and world is not None and world[1] > 1:
            mrd.process_index, mrd.process_count = world
            mrd.transport = "mpi"

    def _host_sum(self, grads: list[np.ndarray]) -> list[np.ndarray]:
        hvd.init()      # (idempotent; again after a reconfiguration shut Horovod down)
        return hvd.grouped_allreduce(grads, op=hvd.Sum, name="apply_gradients")
