"""Launch plans: which instance runs where, with which replicas (pure, no side effects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class InstancePlacement:
    """One instance of a job.

    Attributes:
        index: instance index in ``[0, num_instances)``.
        host: where it runs.
        local_instance_index: its index among the instances of its host.
        replica_index_offset: global index of its first replica.
        num_local_replicas: replicas it runs.
    """

    index: int
    host: str
    local_instance_index: int
    replica_index_offset: int
    num_local_replicas: int

    @property
    def replicas(self) -> range:
        return range(self.replica_index_offset,
                     self.replica_index_offset + self.num_local_replicas)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start a job; built once from the command line, then run.

    Attributes:
        command: the program and its arguments.
        num_instances, num_replicas, ipus_per_replica: the job's shape.
        instances: one placement per instance.
        transport: how instances exchange collective data (``"mpi"`` or ``"grpc"``).
        job_id: a name shared by the instances of this job.
        launcher: what starts the instances (``"mpirun"`` or ``"local"``).
        coordinator_address: ``host:port`` of the coordinator (grpc transport), else "".
        job_token: the secret every gRPC call of the job carries, else "".
        system: the emulated POD the instances model (``"POD16"``); "" lets them choose.
        partition_ipus: the IPU ids reserved for the job (empty: none reserved).
    """

    command: tuple[str, ...]
    num_instances: int
    num_replicas: int
    ipus_per_replica: int
    instances: tuple[InstancePlacement, ...]
    transport: str = "mpi"
    job_id: str = field(default="")
    launcher: str = "mpirun"
    coordinator_address: str = ""
    job_token: str = field(default="", repr=False)
    system: str = ""
    partition_ipus: tuple[int, ...] = ()


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def plan_replicas(num_instances: int, num_replicas: int,
                  hosts: Sequence[str] = ("localhost",)) -> list[InstancePlacement]:
    """Split ``num_replicas`` evenly and in order over ``num_instances`` instances, and the
    instances evenly and in order over ``hosts``.

    Raises:
        ValueError: a count is not positive, or ``num_replicas`` is not a multiple of
            ``num_instances`` (poprun's rule: "Must be divisible by --num-instances").
    """
    _positive("--num-instances", num_instances)
    _positive("--num-replicas", num_replicas)
    if num_replicas % num_instances:
        raise ValueError(f"--num-replicas ({num_replicas}) must be divisible by "
                         f"--num-instances ({num_instances})")
    if not hosts:
        raise ValueError("no hosts given")
    local = num_replicas // num_instances
    per_host = -(-num_instances // len(hosts))
    return [InstancePlacement(index=i, host=hosts[i // per_host],
                              local_instance_index=i % per_host,
                              replica_index_offset=i * local, num_local_replicas=local)
            for i in range(num_instances)]


LAUNCHERS = ("mpirun", "local")


def make_plan(command: Sequence[str], num_instances: int = 1, num_replicas: int | None = None,
              ipus_per_replica: int = 1, transport: str = "mpi", job_id: str = "",
              launcher: str = "mpirun", job_token: str = "",
              system: str = "", transports: Sequence[str] | None = None) -> LaunchPlan:
    """A :class:`LaunchPlan` (``num_replicas`` defaults to ``num_instances``).

    ``transports`` are the transport names the caller knows (poprun passes
    ``ipu_node.transport_names.INSTANCE_TRANSPORTS``: launch imports no ipu_node, so the
    names come from its caller); None: ``transport`` is not checked here.

    Raises:
        ValueError: no command, counts as in :func:`plan_replicas`, an unknown launcher or
            transport, or the MPI transport without mpirun.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; known: {', '.join(LAUNCHERS)}")
    if transports is not None and transport not in transports:
        raise ValueError(f"unknown transport {transport!r}; known: {', '.join(transports)}")
    if transport == "mpi" and launcher != "mpirun":
        raise ValueError("--transport mpi needs --launcher mpirun (MPI ranks are made by "
                         "mpirun); use --transport grpc with --launcher local")
    if not command:
        raise ValueError("no program given: poprun [options] program [args...]")
    num_replicas = num_instances if num_replicas is None else num_replicas
    _positive("--ipus-per-replica", ipus_per_replica)
    instances = tuple(plan_replicas(num_instances, num_replicas))
    return LaunchPlan(tuple(command), num_instances, num_replicas, ipus_per_replica,
                      instances, transport, job_id, launcher, job_token=job_token,
                      system=system)
