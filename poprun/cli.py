"""``poprun``: start a program as a job of several instances, each with its share of replicas.

    poprun [-n N] [--num-replicas R] [--ipus-per-replica K] [--system NAME]
           [--print-topology [yes|no]] [--launcher mpirun|local] [--transport mpi|grpc]
           [-v] program [args...]

``-n`` is ipupod's short form of ``--num-instances`` (Graphcore's poprun has only the long
form). The command line becomes a frozen :class:`launch.plan.LaunchPlan`, which a backend
runs and supervises: ``mpirun`` (MPICH's, with the MPI transport) or ``local`` (poprun's own
children, with the gRPC transport and a coordinator hosted here). Default: mpirun with MPI
when the MPICH mpirun is installed, else local with gRPC; ``-v`` says which and why.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
import logging
import secrets
import sys
import uuid

from ipu_node.env import system_name
from ipu_node.errors import IPUBusyError, IPUError
from ipu_node.occupancy import Occupancy, scope_name
from ipu_node.partition import reserve_partition
from ipu_node.systems import SystemModel, get_system_model
from ipu_node.topology_table import format_topology_table
from ipu_node.transport_names import INSTANCE_TRANSPORTS
from launch.errors import InstanceFailedError, LaunchError
from launch.mpirun import MpirunBackend, find_mpirun
from launch.plan import LAUNCHERS, LaunchPlan, make_plan

logger = logging.getLogger("poprun")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and exit code 2)."""

    def error(self, message: str):
        message = message.replace("program, args", "program")
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="poprun", description=(
        "Run a program as a job of instances of emulated IPUs. Replicas are divided evenly "
        "among the instances."))
    parser.add_argument("-n", "--num-instances", type=_count, default=1, metavar="N",
                        help="number of instances (processes) (default: 1)")
    parser.add_argument("--num-replicas", type=_count, default=None, metavar="R",
                        help="total number of replicas; must be divisible by --num-instances "
                             "(default: the number of instances)")
    parser.add_argument("--ipus-per-replica", type=_count, default=1, metavar="K",
                        help="IPUs per replica (default: 1)")
    parser.add_argument("--system", default=None, metavar="NAME",
                        help="the emulated system: C2-16, POD4, POD16, POD64, POD128, POD256 "
                             "(default: $IPUPOD_SYSTEM, else POD16)")
    parser.add_argument("--print-topology", nargs="?", const="yes", default="no",
                        choices=_YES_NO, metavar="yes|no",
                        help="print the table of hosts, instances, replicas and IPUs first")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None,
                        help="what starts the instances: MPICH's mpirun, or poprun itself "
                             "(default: mpirun if installed, else local)")
    parser.add_argument("--transport", choices=INSTANCE_TRANSPORTS, default=None,
                        help="how instances exchange collective data (default: mpi with "
                             "mpirun, grpc with local)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="say what poprun does (-vv: more)")
    parser.add_argument("program", help="the program to run, e.g. python train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    return parser


_YES_NO = ("yes", "no", "1", "0")


def _bare_flags_say_yes(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--print-topology`` alone means ``--print-topology yes`` (poprun's booleans take
    yes/no/1/0), without taking the program's name as its value."""
    # Options that take a value, from the parser itself: the word after one is not the program.
    value_options = {s for a in parser._actions if a.nargs != 0 for s in a.option_strings}
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--print-topology" and (i + 1 == len(argv) or argv[i + 1] not in _YES_NO):
            out.append("yes")
        if not arg.startswith("-") and (i == 0 or argv[i - 1] not in value_options):
            return out + argv[i + 1:]  # the program: the rest is its own
    return out


def _topology(model: SystemModel, plan: LaunchPlan) -> str:
    """The topology table of ``plan`` on ``model`` (inside its partition, when reserved).

    Raises:
        NotEnoughIPUsError: the job needs more IPUs than the system has.
    """
    return format_topology_table(model, num_instances=plan.num_instances,
                                 num_replicas=plan.num_replicas,
                                 ipus_per_replica=plan.ipus_per_replica,
                                 within=plan.partition_ipus or None)


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


def run_plan(plan: LaunchPlan) -> int:
    """Run ``plan`` with its backend; with the grpc transport, host its coordinator here.

    Raises:
        InstanceFailedError, LaunchError: as the backends.
    """
    coordinator = None
    if plan.transport == "grpc":
        from launch.coordinator import CoordinatorServer
        coordinator = CoordinatorServer(plan.num_instances, plan.job_token)
        plan = replace(plan, coordinator_address=coordinator.address)
        logger.info("coordinator listening on %s", coordinator.address)
    try:
        if plan.launcher == "local":
            from launch.local import LocalBackend
            on_failure = None if coordinator is None else (
                lambda f: coordinator.abort(f.describe(), f.instance))
            return LocalBackend(on_failure=on_failure).run(plan)
        return MpirunBackend().run(plan)
    finally:
        if coordinator is not None:
            coordinator.stop(grace_s=0)


def main(argv: list[str] | None = None) -> int:
    """Run poprun; returns the exit code (2: bad arguments, nothing started)."""
    parser = build_parser()
    argv = _bare_flags_say_yes(parser, list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(format="POPRUN [%(levelname).1s] %(message)s",
                        level=logging.WARNING - 10 * min(args.verbose, 1))
    try:
        launcher, transport, why = choose_backend(args.launcher, args.transport)
        plan = make_plan([args.program, *args.args], args.num_instances, args.num_replicas,
                         args.ipus_per_replica, transport=transport,
                         job_id=uuid.uuid4().hex[:12], launcher=launcher,
                         job_token=secrets.token_hex(16) if transport == "grpc" else "",
                         system=system_name(args.system), transports=INSTANCE_TRANSPORTS)
        model = get_system_model(plan.system)
        _topology(model, plan)  # a job that does not fit the system starts nothing
    except (ValueError, IPUError) as exc:
        sys.stderr.write(f"poprun: error: {exc}\n")
        return 2
    logger.info("launcher %s, transport %s: %s", launcher, transport, why)
    try:
        partition = reserve_partition(model, plan.num_replicas * plan.ipus_per_replica,
                                      job=plan.job_id)
    except IPUBusyError as exc:
        sys.stderr.write(f"poprun: error: {exc}\n")
        return 1
    with partition:
        plan = replace(plan, partition_ipus=partition.ipus)
        logger.info("partition of IPUs %s reserved for job %s", partition.ipus, plan.job_id)
        if args.print_topology in ("yes", "1"):
            print(_topology(model, plan), flush=True)
        try:
            return _run(plan)
        finally:  # every instance has ended: the job's own lock files can go
            Occupancy(model.name, scope_name(plan.job_id)).discard()


def _run(plan: LaunchPlan) -> int:
    """Run ``plan``; the exit code, with failures reported on stderr."""
    try:
        return run_plan(plan)
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
