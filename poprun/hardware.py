"""poprun's options that only mean something on a real POD (and the mpirun arguments), turned
into launch-plan fields and one-line notes: emulated where there is something to emulate,
"no effect" otherwise. Nothing is silently ignored: every option given leaves a note or a
field of the plan.
"""

from __future__ import annotations

import argparse
import os

from ipu_node import env as ipu_env
from ipu_node.hardware.selection import domain_split
from ipu_node.hardware.systems import SystemModel, get_system_model
from launch import env as envnames
from launch.plan import LaunchPlan
from poprun.mpi_args import (MpiArgsError, check_interface, local_interfaces,
                             parse_instance_args, translate_mpi_args)

__all__ = ["emulated_options", "check_ilds", "create_cache_dir", "choose_system",
           "AUTO_SYSTEMS", "Said"]

#: the systems poprun runs a job on when neither ``--system`` nor ``IPUPOD_SYSTEM`` names
#: one and it does not fit the default POD16, smallest first: the default's family (GC200
#: IPU-M2000 PODs), so a job that outgrows POD16 keeps its chip and its numbers
AUTO_SYSTEMS = ("POD64", "POD128", "POD256")


def _no_effect(option: str, value, why: str) -> str:
    return f"{option} {value}: no effect in ipupod: {why}"


def _notes_on_vipu(args: argparse.Namespace) -> list[str]:
    notes = []
    if args.vipu_server_host != "localhost" or args.vipu_server_port != 8090:
        notes.append(f"--vipu-server-host/--vipu-server-port {args.vipu_server_host}:"
                     f"{args.vipu_server_port}: no V-IPU server is contacted (partitions are "
                     "emulated on this machine); passed to instances as IPUOF_VIPU_API_*")
    for option, value, why in (
            ("--vipu-cluster", args.vipu_cluster, "partitions are emulated on this machine"),
            ("--vipu-allocation", args.vipu_allocation, "partitions are emulated on this "
                                                        "machine"),
            ("--host-subnet", args.host_subnet, "hosts are reached by the names given"),
            ("--sync-type", args.sync_type, "emulated IPUs synchronise by the collectives' "
                                            "own agreement"),
            ("--process-placement", args.process_placement, "instances are placed by the "
                                                            "operating system")):
        if value:
            notes.append(_no_effect(option, value, why))
    if args.allow_run_as_root:
        notes.append(_no_effect("--allow-run-as-root", "yes", "MPICH's mpirun runs as root"))
    if args.vipu_partition_attempts > 1:
        notes.append(_no_effect("--vipu-partition-attempts", args.vipu_partition_attempts,
                                "an emulated partition is reserved at the first attempt or "
                                "not at all"))
    if args.offline_mode:
        notes.append("--offline-mode yes: no partition is reserved; instances attach their "
                     "IPUs on their own")
    return notes


def _mpi_options(args: argparse.Namespace, launcher: str, num_instances: int,
                 remote_hosts: tuple[str, ...]) -> tuple[dict, list[str], list[tuple[str, str]]]:
    """Plan fields, notes and job-wide variables from the ``--mpi-*-args`` and
    ``--numa-aware``."""
    global_args = translate_mpi_args(args.mpi_global_args, where="--mpi-global-args")
    local_args = translate_mpi_args(args.mpi_local_args, where="--mpi-local-args")
    mpirun = [*global_args.mpirun_args, *local_args.mpirun_args]
    notes = [*global_args.notes, *local_args.notes]
    per_instance: dict[int, dict[str, str]] = {}
    for text in args.instance_mpi_local_args:
        index, words = parse_instance_args(text)
        if index >= num_instances:
            raise MpiArgsError(f"--instance-mpi-local-args {text!r}: there is no instance "
                               f"{index} (--num-instances {num_instances})")
        where = f"--instance-mpi-local-args {index}:"
        one = translate_mpi_args(words, where=where)
        if one.mpirun_args:
            raise MpiArgsError(f"{where} {' '.join(one.mpirun_args)}: MPICH's mpirun takes "
                               "these for the whole job only; use --mpi-global-args")
        per_instance.setdefault(index, {}).update(one.env)
        notes += one.notes
    if args.numa_aware:
        mpirun += ["-bind-to", "numa"]
        notes.append("--numa-aware yes: mpirun -bind-to numa (instances bound to NUMA nodes "
                     "round-robin)")
    mpirun, more = check_interface(tuple(_merge_pairs(mpirun)), remote_hosts=remote_hosts,
                                   interfaces=local_interfaces())
    mpirun = list(mpirun)
    notes += more
    if launcher != "mpirun" and mpirun:
        notes.append(f"mpirun options {' '.join(mpirun)}: no effect with --launcher {launcher}")
        mpirun = []
    fields = {"mpirun_args": tuple(mpirun),
              "instance_env_extra": tuple((i, tuple(env.items()))
                                          for i, env in sorted(per_instance.items()))}
    return fields, notes, [*global_args.env, *local_args.env]


def _merge_pairs(words: list[str]) -> list[str]:
    """Hydra options (``-flag value`` pairs) with repeats given once (``--mca
    oob_tcp_if_include ib0 --mca btl_tcp_if_include ib0`` is one ``-iface ib0``).

    Raises:
        MpiArgsError: one option with two different values (names both).
    """
    chosen: dict[str, str] = {}
    for flag, value in zip(words[::2], words[1::2]):
        if chosen.setdefault(flag, value) != value:
            raise MpiArgsError(f"mpirun {flag} given twice, as {chosen[flag]!r} and {value!r}")
    return [word for pair in chosen.items() for word in pair]


def emulated_options(args: argparse.Namespace, launcher: str, num_replicas: int,
                     remote_hosts: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """``(plan fields, notes)`` of the hardware and mpirun options of ``args``
    (``remote_hosts``: the job's hosts that are not this machine).

    Raises:
        MpiArgsError: a ``--mpi-*-args`` flag that cannot be passed on (names it), or an
            interface this machine lacks in a job across hosts.
        ValueError: ``--only-output-from-instance`` names no instance.
    """
    fields, notes, env = _mpi_options(args, launcher, args.num_instances, remote_hosts)
    notes += _notes_on_vipu(args)
    env += [(envnames.VIPU_API_HOST, args.vipu_server_host),
            (envnames.VIPU_API_PORT, str(args.vipu_server_port)),
            (envnames.VIPU_API_TIMEOUT, f"{args.vipu_server_timeout:g}")]
    if args.vipu_partition:
        env.append((envnames.VIPU_API_PARTITION_ID, args.vipu_partition))
    if args.executable_cache_path:
        env.append((envnames.EXECUTABLE_CACHE_PATH,
                    os.path.abspath(args.executable_cache_path)))
    only = args.only_output_from_instance
    if only is not None and only >= args.num_instances:
        raise ValueError(f"--only-output-from-instance {only}: there is no instance {only} "
                         f"(--num-instances {args.num_instances})")
    if only is not None:
        notes.append(f"--only-output-from-instance {only}: the output of the other "
                     "instances is not shown (their errors included)")
    fields.update(job_env=tuple(env), only_output_from_instance=only)
    return fields, notes


class Said(str):
    """A note that poprun shows even without ``-v`` (as a warning line): it changes what
    the job runs on."""


def choose_system(explicit: str | None, num_ipus: int,
                  num_ilds: int | None) -> tuple[str, Said | None]:
    """``(system name, note)``: ``explicit`` (``--system``), else ``IPUPOD_SYSTEM``, else the
    default POD16 when it holds ``num_ipus`` IPUs in ``num_ilds`` IPU-Link domains (None:
    any; :func:`~ipu_node.hardware.selection.domain_split`), else the smallest of
    :data:`AUTO_SYSTEMS` that does (note: one line saying which and why; None when nothing
    was chosen for the job). When none holds it, the largest of :data:`AUTO_SYSTEMS`: the
    topology check then names what is missing.
    """
    if explicit or os.environ.get(ipu_env.IPUPOD_SYSTEM):
        return ipu_env.system_name(explicit), None
    default = get_system_model(ipu_env.DEFAULT_SYSTEM)

    def holds(model: SystemModel) -> bool:
        if model.num_ipus < num_ipus:
            return False
        try:
            domain_split(model, num_ipus, num_ilds or 1)
        except ValueError:
            return num_ilds is None  # (any number of domains: V-IPU chooses)
        return True

    if holds(default):
        return default.name, None
    for name in AUTO_SYSTEMS:
        model = get_system_model(name)
        if holds(model):
            why = f"{num_ipus} IPUs" + (f" in {num_ilds} IPU-Link domains" if num_ilds else "")
            return name, Said(f"the job needs {why}, more than the default {default.name} has: "
                          f"running on {name} ({model.description}), the smallest emulated "
                          f"system that holds it (choose one with --system or "
                          f"{ipu_env.IPUPOD_SYSTEM})")
    return AUTO_SYSTEMS[-1], None


def check_ilds(model: SystemModel, plan: LaunchPlan, num_ilds: int | None) -> None:
    """``--num-ilds``: the job's IPUs must split evenly over that many IPU-Link domains of
    ``model``, as V-IPU makes a partition of that many domains, ``size / num_ilds`` IPUs in
    each (:func:`~ipu_node.hardware.selection.domain_split`; the partition is reserved so,
    and the collectives' cost model prices the GW-Links between its domains).

    Raises:
        ValueError: ``model`` has fewer domains, or the job's IPUs do not split evenly over
            ``num_ilds`` domains or do not fit in them (names the numbers).
    """
    if num_ilds is None:
        return
    try:
        domain_split(model, plan.num_replicas * plan.ipus_per_replica, num_ilds)
    except ValueError as exc:
        raise ValueError(f"--num-ilds {num_ilds}: {exc}") from None


def create_cache_dir(path: str | None) -> None:
    """``--executable-cache-path``: create the directory (mode 0700 when new).

    Raises:
        OSError: it cannot be created, or exists and is not a directory.
    """
    if path:
        os.makedirs(path, mode=0o700, exist_ok=True)
