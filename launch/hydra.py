"""The command line and environment of MPICH's ``mpirun`` (Hydra) for a launch plan (pure).

Each instance is one MPMD block with the variables that differ between instances
(``mpirun ... -n 1 -env POPDIST_REPLICA_INDEX_OFFSET 0 ... prog : -n 1 -env ... prog``).
What every instance gets alike, the job token among them, is *not* on the command line
(which every local user can read with ``ps``): it goes into mpirun's own environment, which
Hydra passes to every instance, on this host and on the others (``-genvall``, Hydra's
default; the values travel over Hydra's control connection, not on a command line).

Instances on other hosts (``plan.remote_hosts``) are started by Hydra's ssh launcher: the
plan's hosts become ``-hosts h1:k,h2:k`` (``k`` instances per host, in order), which puts
ranks ``0..k-1`` on ``h1``, the next ``k`` on ``h2``, the same order as
:func:`launch.plan.plan_replicas`. Hydra starts the instances of a host that is this machine
itself, without ssh.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from launch import env as envnames
from launch.plan import LaunchPlan

__all__ = ["mpirun_command_line", "mpirun_environment", "error_file_path"]


def error_file_path(workdir: str, index: int) -> str:
    """Where instance ``index`` writes its error file (see :mod:`launch.errorfile`)."""
    return os.path.join(workdir, f"error.{index}.json")


def _hosts_option(plan: LaunchPlan) -> list[str]:
    if not plan.remote_hosts:
        return []
    per_host = plan.num_instances // len(plan.hosts)
    return ["-hosts", ",".join(f"{host}:{per_host}" for host in plan.hosts)]


def mpirun_command_line(plan: LaunchPlan, mpirun: str, workdir: str,
                        program: Sequence[str]) -> list[str]:
    """The full mpirun command for ``plan``: its output files in ``workdir``, ``program``
    (the instance command, see :func:`launch.mpirun.instance_command`) in every block.

    No secret is in it (:data:`launch.env.SECRET_NAMES`): they are in
    :func:`mpirun_environment`.
    """
    cmd = [mpirun, "-print-all-exitcodes",
           "-outfile-pattern", os.path.join(workdir, "out.%r"),
           "-errfile-pattern", os.path.join(workdir, "err.%r"),
           "-genv", "PYTHONUNBUFFERED", "1",
           *_hosts_option(plan), *plan.mpirun_args]
    for k, placement in enumerate(plan.instances):
        if k:
            cmd.append(":")
        cmd += ["-n", "1"]
        error_file = error_file_path(workdir, placement.index)
        for name, value in envnames.placement_env(plan, placement, error_file).items():
            if name in envnames.SECRET_NAMES:
                raise ValueError(f"{name} may not differ between instances: it is a secret "
                                 "and never goes on mpirun's command line")
            cmd += ["-env", name, value]
        cmd += list(program)
    return cmd


def mpirun_environment(plan: LaunchPlan, base: Mapping[str, str]) -> dict[str, str]:
    """mpirun's own environment: ``base`` (poprun's) plus what every instance of ``plan``
    gets alike (:func:`launch.env.job_env`, the job token among them); Hydra passes it on to
    every instance."""
    return {**base, **envnames.job_env(plan)}
