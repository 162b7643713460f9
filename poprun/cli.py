"""``poprun``: start a program as a job of several instances, each with its share of replicas.

    poprun [options] program [program args]

The options are Graphcore's poprun's (see :mod:`poprun.options`; ``poprun --help``) plus
ipupod's ``-n``, ``--system``, ``--launcher``, ``--transport`` and ``--dry-run``. The
command line becomes a frozen :class:`launch.plan.LaunchPlan` (:func:`plan_from_args`, pure
apart from reading the host's addresses), which a backend runs and supervises: ``mpirun``
(MPICH's, with the MPI transport; also across hosts, through Hydra's ssh launcher) or
``local`` (poprun's own children, with the gRPC transport and a coordinator hosted here).
Default: mpirun with MPI when the MPICH mpirun is installed, else local with gRPC; ``-v``
says which and why. Log lines look like Graphcore's: ``hh:mm:ss.mmm pid POPRUN [I] ...``.

Options that only mean something on a real POD are emulated where there is something to
emulate (the partition name, its registry, the executable cache directory, the IPU-Link
domains, the V-IPU variables) and otherwise say in one line (``-v``) that they have no effect.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import sys
import uuid
from dataclasses import replace
from typing import TextIO

from ipu_node.errors import IPUBusyError, IPUError
from ipu_node.hardware.systems import SystemModel, get_system_model
from ipu_node.hardware.topology_table import format_topology_table
from ipu_node.runtime.occupancy import Occupancy, scope_name
from ipu_node.runtime.partition import reserve_partition
from ipu_node.transport_names import INSTANCE_TRANSPORTS
from launch.errors import InstanceFailedError, JobInterruptedError, LaunchError
from launch.hydra import mpirun_command_line
from launch.mpirun import MpirunBackend, find_mpirun, instance_command
from launch.plan import LaunchPlan, make_plan
from poprun import hardware
from poprun.hosts import expand_hosts, is_this_machine, read_hostfile
from poprun.options import UsageError, build_parser, export_config, find_program, parse_args
from poprun.partitions import PartitionError, prepare_named_partition

__all__ = ["main", "plan_from_args", "prepare_job", "choose_backend", "run_plan",
           "run_reserved", "coordinator_bind_address", "VERSION"]

logger = logging.getLogger("poprun")
VERSION = "ipupod poprun 0.1 (Graphcore poprun command line, SDK 2.x-3.x)"


def _topology(model: SystemModel, plan: LaunchPlan) -> str:
    """The topology table of ``plan`` on ``model`` (inside its partition, when reserved).

    Raises:
        NotEnoughIPUsError: the job needs more IPUs than the system has.
    """
    return format_topology_table(model, num_instances=plan.num_instances,
                                 num_replicas=plan.num_replicas,
                                 ipus_per_replica=plan.ipus_per_replica,
                                 hosts=plan.hosts, within=plan.partition_ipus or None)


def choose_backend(launcher: str | None, transport: str | None,
                   find: "callable" = find_mpirun) -> tuple[str, str, str]:
    """``(launcher, transport, why)`` from the options given (None: not given).

    Raises:
        ValueError: ``--launcher local --transport mpi`` (MPI ranks need mpirun).
    """
    if launcher is None and transport is None:
        try:
            path = find()
        except LaunchError as exc:
            return "local", "grpc", f"no MPICH mpirun ({exc}); using poprun's own launcher"
        return "mpirun", "mpi", f"MPICH mpirun found at {path}"
    if launcher is None:
        launcher = "mpirun" if transport == "mpi" else "local"
        return launcher, transport, f"--transport {transport} given"
    if transport is None:
        transport = "mpi" if launcher == "mpirun" else "grpc"
        return launcher, transport, f"--launcher {launcher} given"
    if launcher == "local" and transport == "mpi":
        raise ValueError("--transport mpi needs --launcher mpirun (MPI ranks are made by "
                         "mpirun); use --transport grpc with --launcher local")
    return launcher, transport, "both given"


def _hosts(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """``(hosts, remote hosts)`` of ``--host``/``--hostfile`` (default: this machine)."""
    if args.host and args.hostfile:
        raise UsageError("--host and --hostfile are mutually exclusive")
    if args.hostfile:
        hosts = read_hostfile(args.hostfile)
    elif args.host:
        hosts = expand_hosts(args.host)
    else:
        return ["localhost"], []
    return hosts, [h for h in hosts if not is_this_machine(h)]


def plan_from_args(args: argparse.Namespace, program: list[str],
                   find: "callable" = find_mpirun) -> tuple[LaunchPlan, list[str]]:
    """The launch plan of a parsed command line, and the notes (one line each) on options
    that have no effect or were translated (a :class:`poprun.hardware.Said` note, the system
    chosen for a job that outgrows the default, is shown even without ``-v``). Starts
    nothing, creates nothing.

    Raises:
        ValueError: the command line is inconsistent (one line naming what; UsageError,
            HostError and MpiArgsError are ValueErrors).
    """
    hosts, remote = _hosts(args)
    launcher, transport = args.launcher, args.transport
    if remote and launcher is None:
        launcher = "mpirun"
    launcher, transport, why = choose_backend(launcher, transport, find)
    notes = [f"launcher {launcher}, transport {transport}: {why}"]
    num_replicas = args.num_replicas or args.num_instances
    options, more = hardware.emulated_options(args, launcher, num_replicas, tuple(remote))
    notes += more
    system, chosen = hardware.choose_system(args.system, num_replicas * args.ipus_per_replica,
                                            args.num_ilds)
    if chosen:
        notes.append(chosen)
    job_id = args.vipu_partition or uuid.uuid4().hex[:12]
    plan = make_plan(program, args.num_instances, num_replicas, args.ipus_per_replica,
                     transport=transport, job_id=job_id, launcher=launcher,
                     job_token=secrets.token_hex(16) if transport == "grpc" else "",
                     system=system, transports=INSTANCE_TRANSPORTS,
                     hosts=hosts, remote_hosts=remote,
                     report_dir=os.path.abspath(args.report_dir) if args.report_dir else "",
                     **options)
    if remote:
        notes.append(f"hosts {','.join(hosts)}: {','.join(remote)} started over ssh by "
                     "mpirun (Hydra)")
    return plan, notes


def prepare_job(args: argparse.Namespace, program: list[str],
                find: "callable" = find_mpirun) -> tuple[LaunchPlan, SystemModel, list[str]]:
    """The plan of a parsed command line (:func:`plan_from_args`), the model of its system,
    and the notes, once every check that needs no process has passed: the IPU-Link domains,
    the job fits the system, the coordinator's address. Starts nothing.

    Raises:
        ValueError: as :func:`plan_from_args`, or the job does not fit the system (one line).
        IPUError: the system is unknown or too small.
    """
    plan, notes = plan_from_args(args, program, find)
    model = get_system_model(plan.system)
    hardware.check_ilds(model, plan, args.num_ilds)
    _topology(model, plan)  # a job that does not fit the system starts nothing
    if plan.transport == "grpc":
        coordinator_bind_address(plan)
    return plan, model, notes


def coordinator_bind_address(plan: LaunchPlan) -> str:
    """Where poprun's gRPC coordinator listens: loopback for a job on this machine; across
    hosts, the address given in ``--host`` for this machine (the others must reach it).

    Raises:
        ValueError: a job across hosts whose ``--host`` names this machine only by a loopback
            name, or not at all (poprun must run on one of the hosts).
    """
    if not plan.remote_hosts:
        return "127.0.0.1:0"
    here = [h for h in plan.hosts if h not in plan.remote_hosts]
    usable = [h for h in here if h != "localhost" and not h.startswith("127.")]
    if not usable:
        raise ValueError("--transport grpc across hosts: poprun hosts the coordinator, so "
                         "--host must name this machine by an address the other hosts reach "
                         f"(hosts given: {','.join(plan.hosts)})")
    return f"{usable[0]}:0"


def run_plan(plan: LaunchPlan, stdout: TextIO | None = None,
             stderr: TextIO | None = None) -> int:
    """Run ``plan`` with its backend; with the grpc transport, host its coordinator here.
    ``stdout``, ``stderr``: where the instances' tagged output goes (default: this
    process's ``sys.stdout``/``sys.stderr``).

    Raises:
        InstanceFailedError, LaunchError: as the backends.
    """
    coordinator = None
    if plan.transport == "grpc":
        from launch.coordinator import CoordinatorServer
        coordinator = CoordinatorServer(plan.num_instances, plan.job_token,
                                        coordinator_bind_address(plan))
        plan = replace(plan, coordinator_address=coordinator.address)
        logger.info("coordinator listening on %s", coordinator.address)
    try:
        if plan.launcher == "local":
            from launch.local import LocalBackend
            on_failure = None if coordinator is None else (
                lambda f: coordinator.abort(f.describe(), f.instance))
            return LocalBackend(stdout=stdout, stderr=stderr, on_failure=on_failure).run(plan)
        return MpirunBackend(stdout=stdout, stderr=stderr).run(plan)
    finally:
        if coordinator is not None:
            coordinator.stop(grace_s=0)


class _GraphcoreFormatter(logging.Formatter):
    """``hh:mm:ss.mmm pid POPRUN [I] message``, as Graphcore's poprun logs."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, "%H:%M:%S") + f".{int(record.msecs):03d}"
        return f"{stamp} {record.process} POPRUN [{record.levelname[0]}] {record.getMessage()}"


def _setup_logging(verbose: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_GraphcoreFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, _GraphcoreFormatter)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING if verbose == 0 else
                  logging.INFO if verbose == 1 else logging.DEBUG)


def _fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"poprun: error: {message}\n")
    return code


def _print_version(fmt: str) -> int:
    if fmt == "full-json":
        print(json.dumps({"poprun": VERSION, "python": sys.version.split()[0]}))
    elif fmt == "full-text":
        print(f"{VERSION}\npython {sys.version.split()[0]}")
    else:
        print(VERSION)
    return 0


def _export(parser, args) -> None:
    path = args.export_config
    if os.path.exists(path) and not args.overwrite_config:
        raise UsageError(f"--export-config {path}: the file exists; add --overwrite-config yes")
    with open(path, "w") as f:
        json.dump(export_config(parser, args), f, indent=2, sort_keys=True)


def _dry_run(plan: LaunchPlan, model: SystemModel) -> int:
    """Print what would run, start nothing."""
    print(_topology(model, plan))
    if plan.launcher == "mpirun":
        try:
            mpirun = find_mpirun()
        except LaunchError:
            mpirun = "mpirun"
        cmd = mpirun_command_line(plan, mpirun, "<workdir>",
                                  instance_command(plan.command, guard=True))
        print("mpirun command line: " + " ".join(cmd))
    else:
        print("instances started by poprun itself: " + " ".join(instance_command(plan.command)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run poprun; returns the exit code (2: bad arguments, nothing started)."""
    parser = build_parser()
    try:
        args, program = parse_args(parser, list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        return _fail(f"{exc} (see poprun --help)")
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.version:
        return _print_version(args.version_format)
    _setup_logging(max(args.verbose, 2 if args.debug else 0))
    if not program:
        return _fail("no program given: poprun [options] program [program args]")
    if find_program(program[0]) is None:
        return _fail(f"{program[0]!r} is neither an option of poprun nor a program (not a file, "
                     "not on PATH)")
    try:
        plan, model, notes = prepare_job(args, program)
        if args.export_config:
            _export(parser, args)
    except (ValueError, IPUError, OSError) as exc:
        return _fail(str(exc))
    for note in notes:
        (logger.warning if isinstance(note, hardware.Said) else logger.info)("%s", note)
    if args.dry_run:
        return _dry_run(plan, model)
    try:
        hardware.create_cache_dir(args.executable_cache_path)
        named = None if not args.vipu_partition else prepare_named_partition(
            model.name, args.vipu_partition, plan.num_replicas * plan.ipus_per_replica,
            update=args.update_partition, reset=args.reset_partition)
    except (PartitionError, OSError) as exc:
        return _fail(str(exc))
    except IPUBusyError as exc:
        return _fail(str(exc), 1)
    try:
        return _reserve_and_run(plan, model, args)
    finally:
        if named is not None:
            named.finish(args.remove_partition)


def run_reserved(plan: LaunchPlan, model: SystemModel, *, offline: bool = False,
                 print_topology: bool = False, named_partition: bool = False,
                 num_ilds: int | None = None, stdout: TextIO | None = None,
                 stderr: TextIO | None = None) -> int:
    """Reserve the job's IPUs on ``model`` (unless ``offline``: ``--offline-mode``), run
    ``plan`` (:func:`run_plan`), and release them, the job's own lock files included
    (unless ``named_partition``: a ``--vipu-partition`` outlives its job); ``num_ilds``
    (``--num-ilds``) spreads the partition evenly over that many IPU-Link domains.

    Returns:
        0 when every instance succeeded.

    Raises:
        IPUError: the IPUs are busy, or the lock directory is unusable (nothing started).
        InstanceFailedError, LaunchError, JobInterruptedError: as :func:`run_plan`.
    """
    if offline:
        if print_topology:
            print(_topology(model, plan), flush=True)
        return run_plan(plan, stdout, stderr)
    partition = reserve_partition(model, plan.num_replicas * plan.ipus_per_replica,
                                  job=plan.job_id, num_ilds=num_ilds)
    with partition:
        plan = replace(plan, partition_ipus=partition.ipus)
        logger.info("partition of IPUs %s reserved for job %s", partition.ipus, plan.job_id)
        if print_topology:
            print(_topology(model, plan), flush=True)
        try:
            return run_plan(plan, stdout, stderr)
        finally:  # every instance has ended: the job's own lock files can go
            if not named_partition:
                Occupancy(model.name, scope_name(plan.job_id)).discard()


def _reserve_and_run(plan: LaunchPlan, model: SystemModel, args: argparse.Namespace) -> int:
    """Run ``plan``; the exit code, with failures reported on stderr."""
    try:
        return run_reserved(plan, model, offline=bool(args.offline_mode),
                            print_topology=bool(args.print_topology),
                            named_partition=bool(args.vipu_partition),
                            num_ilds=args.num_ilds)
    except IPUError as exc:  # busy, or an unusable lock directory
        return _fail(str(exc), 1)
    except JobInterruptedError as exc:   # 130 for SIGINT, 143 for SIGTERM
        sys.stderr.write(f"poprun: {exc}\n")
        return exc.exit_code
    except LaunchError as exc:
        sys.stderr.write(f"poprun: error: {exc}\n")
        return 1
    except InstanceFailedError as exc:
        others = "; the other instances were stopped" if plan.num_instances > 1 else ""
        sys.stderr.write(f"poprun: {exc}{others}\n")
        cause = exc.root_cause
        return cause.exit_code or (128 + cause.signal if cause.signal else 1)

if __name__ == "__main__":
    sys.exit(main())
