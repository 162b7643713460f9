"""``poprun``: start a program as a job of several instances, each with its share of replicas.

    poprun [-n N] [--num-replicas R] [--ipus-per-replica K] [-v] program [args...]

``-n`` is ipupod's short form of ``--num-instances`` (Graphcore's poprun has only the long
form). The command line becomes a frozen :class:`launch.plan.LaunchPlan`, which the mpirun
backend runs and supervises.
"""

from __future__ import annotations

import argparse
import logging
import sys
import uuid

from ipu_node.env import system_name
from ipu_node.errors import IPUError
from ipu_node.systems import get_system_model
from ipu_node.topology_table import format_topology_table
from launch.errors import InstanceFailedError, LaunchError
from launch.mpirun import MpirunBackend
from launch.plan import LaunchPlan, make_plan


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
                        choices=("yes", "no", "1", "0"), metavar="yes|no",
                        help="print the table of hosts, instances, replicas and IPUs first")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="say what poprun does (-vv: more)")
    parser.add_argument("program", help="the program to run, e.g. python train.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    return parser


_YES_NO = ("yes", "no", "1", "0")


def _bare_flags_say_yes(argv: list[str]) -> list[str]:
    """``--print-topology`` alone means ``--print-topology yes`` (poprun's booleans take
    yes/no/1/0), without taking the program's name as its value."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg == "--print-topology" and (i + 1 == len(argv) or argv[i + 1] not in _YES_NO):
            out.append("yes")
        if not arg.startswith("-") and (i == 0 or argv[i - 1] not in _VALUE_OPTIONS):
            return out + argv[i + 1:]  # the program: the rest is its own
    return out


_VALUE_OPTIONS = ("-n", "--num-instances", "--num-replicas", "--ipus-per-replica", "--system",
                  "--print-topology")


def _topology(plan: LaunchPlan) -> str:
    """The topology table of ``plan`` on its system.

    Raises:
        ValueError: an unknown system name.
        NotEnoughIPUsError: the job needs more IPUs than the system has.
    """
    model = get_system_model(plan.system)
    return format_topology_table(model, num_instances=plan.num_instances,
                                 num_replicas=plan.num_replicas,
                                 ipus_per_replica=plan.ipus_per_replica)


def main(argv: list[str] | None = None) -> int:
    """Run poprun; returns the exit code (2: bad arguments, nothing started)."""
    parser = build_parser()
    argv = _bare_flags_say_yes(list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(format="POPRUN [%(levelname).1s] %(message)s",
                        level=logging.WARNING - 10 * min(args.verbose, 1))
    try:
        plan = make_plan([args.program, *args.args], args.num_instances, args.num_replicas,
                         args.ipus_per_replica, transport="mpi", job_id=uuid.uuid4().hex[:12],
                         system=system_name(args.system))
        table = _topology(plan)
    except (ValueError, IPUError) as exc:
        sys.stderr.write(f"poprun: error: {exc}\n")
        return 2
    if args.print_topology in ("yes", "1"):
        print(table, flush=True)
    try:
        return MpirunBackend().run(plan)
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
