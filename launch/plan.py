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
        report_dir: where every instance writes its run report (``IPUPOD_REPORT_DIR``,
            :mod:`collectives.run_report`); "" for none.
        hosts: the hosts of the job, in order (instances are divided evenly among them).
        remote_hosts: those of ``hosts`` that are not this machine (started over ssh).
        job_env: extra variables every instance gets (``NAME=value`` pairs, not secret:
            ``-x NAME=value`` of ``--mpi-global-args``, ``IPUOF_VIPU_API_*``,
            ``POPDIST_EXECUTABLE_CACHE_PATH``).
        instance_env_extra: per instance index, extra variables only it gets
            (``--mpi-local-args``/``--instance-mpi-local-args`` ``-x``).
        mpirun_args: extra global options for Hydra's mpiexec (translated from Open MPI
            flags, e.g. ``("-iface", "eth0", "-bind-to", "core")``).
        only_output_from_instance: show the output of this instance only (None: all).
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
    report_dir: str = ""
    hosts: tuple[str, ...] = ("localhost",)
    remote_hosts: tuple[str, ...] = ()
    job_env: tuple[tuple[str, str], ...] = ()
    instance_env_extra: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()
    mpirun_args: tuple[str, ...] = ()
    only_output_from_instance: int | None = None

    def extra_env_of(self, index: int) -> dict[str, str]:
        """The extra variables of instance ``index`` alone (they win over ``job_env``)."""
        env: dict[str, str] = {}
        for i, pairs in self.instance_env_extra:
            if i == index:
                env.update(pairs)
        return env


#: the largest instance, replica or IPU count a plan accepts. ipupod assumption: the largest
#: modelled system (POD256) has 256 IPUs, so no real job comes near; the bound is checked
#: before anything that grows with a count is allocated (``-n 100000000000`` is refused at
#: once, not after filling memory).
MAX_COUNT = 1 << 16


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value > MAX_COUNT:
        raise ValueError(f"{name} {value} is more than any system can run (at most "
                         f"{MAX_COUNT}; the largest modelled system, POD256, has 256 IPUs)")


def plan_replicas(num_instances: int, num_replicas: int,
                  hosts: Sequence[str] = ("localhost",)) -> list[InstancePlacement]:
    """Split ``num_replicas`` evenly and in order over ``num_instances`` instances, and the
    instances evenly and in order over ``hosts`` (as Graphcore's poprun: "The instances are
    divided evenly among the hosts"): with 4 instances on ``h1,h2``, instances 0 and 1 run on
    ``h1`` (local instance indices 0, 1) and 2 and 3 on ``h2`` (0, 1).

    Raises:
        ValueError: a count is not positive, ``num_replicas`` is not a multiple of
            ``num_instances`` (poprun's rule: "Must be divisible by --num-instances"), or
            ``num_instances`` not a multiple of the number of hosts.
    """
    _positive("--num-instances", num_instances)
    _positive("--num-replicas", num_replicas)
    if num_replicas % num_instances:
        raise ValueError(f"--num-replicas ({num_replicas}) must be divisible by "
                         f"--num-instances ({num_instances})")
    if not hosts:
        raise ValueError("no hosts given")
    if num_instances % len(hosts):
        raise ValueError(f"--num-instances ({num_instances}) must be divisible by the number "
                         f"of hosts ({len(hosts)}: {','.join(hosts)}); poprun divides the "
                         "instances evenly among the hosts")
    local = num_replicas // num_instances
    per_host = num_instances // len(hosts)
    return [InstancePlacement(index=i, host=hosts[i // per_host],
                              local_instance_index=i % per_host,
                              replica_index_offset=i * local, num_local_replicas=local)
            for i in range(num_instances)]


LAUNCHERS = ("mpirun", "local")


def make_plan(command: Sequence[str], num_instances: int = 1, num_replicas: int | None = None,
              ipus_per_replica: int = 1, transport: str = "mpi", job_id: str = "",
              launcher: str = "mpirun", job_token: str = "",
              system: str = "", transports: Sequence[str] | None = None,
              hosts: Sequence[str] = ("localhost",), remote_hosts: Sequence[str] = (),
              **options) -> LaunchPlan:
    """A :class:`LaunchPlan` (``num_replicas`` defaults to ``num_instances``); ``options``
    are further :class:`LaunchPlan` fields (``job_env``, ``mpirun_args``, ``report_dir``, ...).

    ``transports`` are the transport names the caller knows (poprun passes
    ``ipu_node.transport_names.INSTANCE_TRANSPORTS``: launch imports no ipu_node, so the
    names come from its caller); None: ``transport`` is not checked here.

    Raises:
        ValueError: no command, counts as in :func:`plan_replicas`, an unknown launcher or
            transport, the MPI transport without mpirun, or remote hosts without mpirun.
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
    if remote_hosts and launcher != "mpirun":
        raise ValueError(f"hosts {','.join(remote_hosts)} are not this machine: instances on "
                         "other hosts are started by mpirun (--launcher mpirun)")
    instances = tuple(plan_replicas(num_instances, num_replicas, tuple(hosts)))
    return LaunchPlan(tuple(command), num_instances, num_replicas, ipus_per_replica,
                      instances, transport, job_id, launcher, job_token=job_token,
                      system=system, hosts=tuple(hosts), remote_hosts=tuple(remote_hosts),
                      **options)
