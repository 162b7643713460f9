"""The share of a job that poprun's environment gives this instance, and its IPU config.

poprun gives every instance it starts the ``POPDIST_*`` variables (Graphcore's names,
anchors §1.2) and ipupod's ``IPUPOD_*`` ones (instances, transport, coordinator, token),
written by ``launch.env`` and read here (names and reader in :mod:`ipu_node.env`): nothing
registers itself with ipu_node; ipu_node reads what the launcher wrote.

* :func:`check_share` checks that the values agree with each other (a job script that
  edits one gets told, instead of a hang or wrong shards);
* :func:`distribute` puts a share of a job into an :class:`~ipu_node.config.IPUConfig`;
* :func:`launched_config` is this instance's default config when poprun started it, for a
  program that never configures its IPU system itself, as Horovod and PopTorch programs do
  not (``hvd.init()``).

The PopDist API (``poprun.popdist``, ``import popdist``) reads the same values through
:func:`ipu_node.env.env_int` and puts them into a config through :func:`distribute`,
adding what the other launchers give (TF_CONFIG's cluster, plain mpirun's ranks).
"""

from __future__ import annotations

import os

from ipu_node import env

__all__ = ["check_share", "distribute", "launched_config", "started_by_poprun"]


def started_by_poprun() -> bool:
    """Whether poprun started this process (``POPDIST_NUM_TOTAL_REPLICAS`` is set).

    Raises:
        ValueError: the variable is not an integer.
    """
    return env.env_int(env.POPDIST_NUM_TOTAL_REPLICAS) is not None


def check_share(num_total_replicas: int, num_local_replicas: int, replica_index_offset: int,
                num_ipus_per_replica: int) -> None:
    """Check that an instance's share of a poprun job agrees with itself and with the
    instance count and index poprun also gave (``IPUPOD_NUM_INSTANCES``,
    ``IPUPOD_INSTANCE_INDEX``, when set).

    Raises:
        ValueError: one line naming the variables, their values and the rule broken.
    """
    total, local = num_total_replicas, num_local_replicas
    offset, ipus = replica_index_offset, num_ipus_per_replica
    where = "in the environment poprun gave this instance"
    for name, value in ((env.POPDIST_NUM_TOTAL_REPLICAS, total),
                        (env.POPDIST_NUM_LOCAL_REPLICAS, local),
                        (env.POPDIST_NUM_IPUS_PER_REPLICA, ipus)):
        if value < 1:
            raise ValueError(f"{name}={value} {where}: must be >= 1")
    if total % local:
        raise ValueError(f"{env.POPDIST_NUM_TOTAL_REPLICAS}={total} is not a multiple of "
                         f"{env.POPDIST_NUM_LOCAL_REPLICAS}={local} {where}")
    if offset < 0 or offset % local or offset >= total:
        raise ValueError(f"{env.POPDIST_REPLICA_INDEX_OFFSET}={offset} {where}: must be a "
                         f"multiple of {env.POPDIST_NUM_LOCAL_REPLICAS}={local} in [0, "
                         f"{env.POPDIST_NUM_TOTAL_REPLICAS}={total})")
    for name, value in ((env.IPUPOD_NUM_INSTANCES, total // local),
                        (env.IPUPOD_INSTANCE_INDEX, offset // local)):
        given = env.env_int(name)
        if given is not None and given != value:
            raise ValueError(f"{name}={given} {where} disagrees with the POPDIST_* values "
                             f"({env.POPDIST_NUM_TOTAL_REPLICAS}={total}, "
                             f"{env.POPDIST_NUM_LOCAL_REPLICAS}={local}, "
                             f"{env.POPDIST_REPLICA_INDEX_OFFSET}={offset} give {value})")


def distribute(config, ipus_per_replica: int, num_local_replicas: int, num_instances: int = 1,
               instance_index: int = 0):
    """Put an instance's share of a job into ``config`` (an
    :class:`~ipu_node.config.IPUConfig`): ``ipus_per_replica``, ``auto_select_ipus`` (the IPUs
    of the local replicas) and, for a job of several instances, its
    ``experimental.multi_replica_distribution``: process count and index, and the transport
    poprun chose (``IPUPOD_TRANSPORT``; for grpc the coordinator's address, the job token
    and the listen address). Returns ``config``."""
    config.ipus_per_replica = ipus_per_replica
    config.auto_select_ipus = ipus_per_replica * num_local_replicas
    if num_instances > 1:
        mrd = config.experimental.multi_replica_distribution
        mrd.process_count = num_instances
        mrd.process_index = instance_index
        transport = os.environ.get(env.IPUPOD_TRANSPORT)
        if transport:
            mrd.transport = transport
        if transport == "grpc":
            mrd.coordinator_address = os.environ.get(env.IPUPOD_COORDINATOR_ADDRESS, "")
            mrd.job_token = os.environ.get(env.IPUPOD_JOB_TOKEN, "")
            mrd.listen_address = os.environ.get(env.IPUPOD_LISTEN_ADDRESS, "")
    return config


def launched_config():
    """This instance's default :class:`~ipu_node.config.IPUConfig` when poprun started it
    (its share of the job, as ``popdist.set_ipu_config(IPUConfig(),
    ipus_per_replica=popdist.getNumIpusPerReplica())`` makes it), else None.

    Raises:
        ValueError: a variable is not an integer, or the values disagree
            (:func:`check_share`).
    """
    total = env.env_int(env.POPDIST_NUM_TOTAL_REPLICAS)
    if total is None:
        return None
    from ipu_node.runtime.config import IPUConfig

    def given(name: str, default: int) -> int:
        value = env.env_int(name)
        return default if value is None else value
    local = given(env.POPDIST_NUM_LOCAL_REPLICAS, 1)
    offset = given(env.POPDIST_REPLICA_INDEX_OFFSET, 0)
    ipus = given(env.POPDIST_NUM_IPUS_PER_REPLICA, 1)
    check_share(total, local, offset, ipus)
    return distribute(IPUConfig(), ipus, local, total // local, offset // local)
