"""poprun's command line: every option of Graphcore's poprun (SDK 2.x-3.x, anchors §1.1)
plus ipupod's own, and the split of argv into poprun's options and the program.

Forms accepted, as Graphcore's poprun (boost program_options) accepts them: ``--opt=value``
and ``--opt value``; a long option by any prefix that names it alone (``--num-instance 2``;
a prefix of several is an error naming them); values with spaces (``--mpi-global-args="--tag-output --bind-to none"``);
booleans as ``yes/no/1/0/true/false`` or bare (``--numa-aware`` means yes); ``-v``, ``-vv``,
``--vv``. poprun's options end at the program: the first word that is not an option or an
option's value. A word that starts with ``-`` and is not an option, or a program that is
neither a file nor on ``PATH``, is a usage error naming it (exit 2) before anything starts.

ipupod's own options: ``-n`` (short for ``--num-instances``; Graphcore's poprun has only the
long form), ``--system``, ``--launcher``, ``--transport``, ``--dry-run``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from typing import Sequence

from ipu_node.hardware.systems import SYSTEM_NAMES
from ipu_node.transport_names import INSTANCE_TRANSPORTS
from launch.plan import LAUNCHERS

__all__ = ["UsageError", "build_parser", "split_argv", "parse_args", "find_program",
           "yes_no", "export_config"]

_TRUE = ("yes", "1", "true", "on")
_FALSE = ("no", "0", "false", "off")
_PYTHON = re.compile(r"python[0-9.]*$")


class UsageError(ValueError):
    """A bad command line: poprun prints it in one line and exits 2, starting nothing."""


def yes_no(text: str) -> bool:
    """A poprun boolean: ``yes/no/1/0/true/false/on/off`` (any case).

    Raises:
        argparse.ArgumentTypeError: anything else (names the value).
    """
    word = str(text).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not yes/no/1/0/true/false")


def _at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value
    return convert


_count = _at_least(1, "a positive integer")
_index = _at_least(0, ">= 0")


def _port(text: str) -> int:
    value = _index(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number <= 65535, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and exit code 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _bool(group, *names: str, default: bool | None, help: str) -> None:
    group.add_argument(*names, type=yes_no, nargs="?", const=True, default=default,
                       metavar="yes|no", help=help)


class _VeryVerbose(argparse.Action):
    """``--vv``: Graphcore's spelling of ``-vv``."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.verbose = max(namespace.verbose or 0, 2)


def build_parser() -> argparse.ArgumentParser:
    """The parser of poprun's options (the program and its arguments are not parsed here:
    see :func:`split_argv`)."""
    p = _Parser(prog="poprun", allow_abbrev=False,
                usage="poprun [options] program [program args]",
                description="Run a program as a job of instances of emulated IPUs. Replicas "
                            "are divided evenly among the instances, instances among hosts.")
    g = p.add_argument_group("generic options")
    g.add_argument("--version", action="store_true", help="print the version and exit")
    g.add_argument("--version-format", choices=("text", "full-text", "full-json"),
                   default="text", help="--version's format (default: text)")
    g.add_argument("--import-config", metavar="FILE",
                   help="read options from FILE (JSON: option name -> value); the command "
                        "line overrides them")
    g.add_argument("--export-config", metavar="FILE", help="write the options to FILE (JSON)")
    _bool(g, "--overwrite-config", default=False,
          help="allow --export-config to overwrite FILE (default: no)")
    _bool(g, "--debug", default=False, help="debug mode: as -vv")

    c = p.add_argument_group("configuration")
    c.add_argument("-H", "--host", metavar="HOSTS",
                   help="hosts to run instances on: host0,host1 or host[0-2,4]; instances are "
                        "divided evenly among them (default: this machine)")
    c.add_argument("--hostfile", metavar="FILE",
                   help="a file of hosts, one a line (mutually exclusive with --host)")
    c.add_argument("--host-subnet", metavar="SUBNET",
                   help="subnet of the hosts' addresses (no effect in ipupod)")
    c.add_argument("--num-replicas", type=_count, default=None, metavar="R",
                   help="total number of replicas; divisible by --num-instances "
                        "(default: the number of instances)")
    c.add_argument("--ipus-per-replica", type=_count, default=1, metavar="K",
                   help="IPUs per replica (default: 1)")
    c.add_argument("-n", "--num-instances", type=_count, default=1, metavar="N",
                   help="number of instances (processes) (default: 1); -n is ipupod's short "
                        "form")
    c.add_argument("--num-ilds", type=_count, default=None, metavar="N",
                   help="IPU-Link domains the job spans (checked against the system model)")
    c.add_argument("--vipu-server-host", default="localhost", metavar="HOST",
                   help="V-IPU server host, passed to instances as IPUOF_VIPU_API_HOST")
    c.add_argument("--vipu-server-port", type=_port, default=8090, metavar="PORT",
                   help="V-IPU server port (IPUOF_VIPU_API_PORT) (default: 8090)")
    c.add_argument("--vipu-server-timeout", type=_seconds, default=120.0, metavar="S",
                   help="V-IPU request timeout in seconds (IPUOF_VIPU_API_TIMEOUT) "
                        "(default: 120)")
    c.add_argument("--vipu-partition", metavar="NAME",
                   help="name of the job's emulated partition (gc-monitor shows it)")
    c.add_argument("--vipu-partition-attempts", type=_count, default=1, metavar="N",
                   help="attempts to reserve the partition (default: 1)")
    _bool(c, "--update-partition", default=False,
          help="resize an existing named partition to the job (default: no)")
    _bool(c, "--reset-partition", default=None,
          help="clear a named partition's stale state before the job")
    _bool(c, "--remove-partition", default=True,
          help="remove the named partition after the job (default: yes)")
    c.add_argument("--vipu-cluster", metavar="NAME",
                   help="V-IPU cluster (deprecated in Graphcore's poprun; no effect here)")
    c.add_argument("--vipu-allocation", metavar="NAME",
                   help="V-IPU allocation (no effect here)")
    c.add_argument("--executable-cache-path", metavar="DIR",
                   help="executable cache directory: created, passed to instances as "
                        "POPDIST_EXECUTABLE_CACHE_PATH")
    c.add_argument("--mpi-global-args", metavar="ARGS", default="",
                   help="mpirun options for all instances (Open MPI flags are translated "
                        "for MPICH's mpirun)")
    c.add_argument("--mpi-local-args", metavar="ARGS", default="",
                   help="mpirun options for each instance (e.g. -x NAME=value)")
    c.add_argument("--instance-mpi-local-args", metavar="I:ARGS", action="append", default=[],
                   help="mpirun options for instance I only; repeatable")
    _bool(c, "--numa-aware", default=False,
          help="bind instances to NUMA nodes round-robin (mpirun: -bind-to numa)")
    c.add_argument("--print-topology", type=yes_no, nargs="?", const=True, default=False,
                   metavar="yes|no", help="print the table of hosts, ILDs, instances, "
                                          "replicas and IPUs first")
    c.add_argument("--only-output-from-instance", type=_index, default=None, metavar="I",
                   help="show the output of instance I only")
    _bool(c, "--offline-mode", default=False,
          help="run without reserving IPUs (no partition)")
    c.add_argument("--sync-type", metavar="TYPE", help="IPU sync type (no effect here)")
    c.add_argument("--process-placement", metavar="MODE",
                   help="process placement on the host (no effect here)")
    _bool(c, "--allow-run-as-root", default=False,
          help="accepted for scripts that pass it; MPICH's mpirun never refuses root")
    c.add_argument("-v", "--verbose", action="count", default=0,
                   help="say what poprun does (-vv/--vv: more)")
    c.add_argument("--vv", action=_VeryVerbose, nargs=0, help="very verbose: as -vv")

    o = p.add_argument_group("ipupod")
    o.add_argument("--system", default=None, metavar="NAME",
                   help=f"the emulated system: {', '.join(SYSTEM_NAMES)} "
                        "(default: $IPUPOD_SYSTEM, else POD16)")
    o.add_argument("--launcher", choices=LAUNCHERS, default=None,
                   help="what starts the instances (default: mpirun if installed, else local)")
    o.add_argument("--transport", choices=INSTANCE_TRANSPORTS, default=None,
                   help="how instances exchange collective data (default: mpi with mpirun, "
                        "grpc with local)")
    o.add_argument("--report-dir", default=None, metavar="DIR",
                   help="every instance writes its run report (JSON, Chrome trace) into DIR "
                        "at exit; read it with ipupod-report (sets IPUPOD_REPORT_DIR)")
    o.add_argument("--dry-run", action="store_true",
                   help="print the plan (and the mpirun command line) and start nothing")
    return p


def _option_table(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def _long_option(table: dict[str, argparse.Action], given: str) -> str:
    """The long option that ``given`` abbreviates, as Graphcore's poprun (boost
    program_options with guessing) takes it: an exact name, else the one option whose name
    starts with ``given`` (``--num-instance`` is ``--num-instances``). Returns ``given``
    when no option starts with it (the caller names it unknown).

    Raises:
        UsageError: ``given`` starts more than one option's name (names them all).
    """
    if given in table or len(given) < 3:
        return given
    matches = sorted({s for s in table if s.startswith("--") and s.startswith(given)},
                     key=lambda s: list(table).index(s))
    if len(matches) > 1:
        raise UsageError(f"option {given!r} is ambiguous and matches "
                         + ", ".join(repr(m) for m in matches))
    return matches[0] if matches else given


def split_argv(parser: argparse.ArgumentParser,
               argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(options, program)``: poprun's options, each as one ``--opt=value`` word, and the
    program with its arguments (the rest of ``argv`` from the first word that is not an
    option or an option's value).

    Raises:
        UsageError: an unknown option (named), an option without its value, or a value
            given to an option that takes none.
    """
    table = _option_table(parser)
    options: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return options, list(argv[i + 1:])
        if not word.startswith("-") or word == "-":
            return options, list(argv[i:])
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if name not in table and not word.startswith("--"):
            if re.fullmatch(r"-v+", word):
                options.append(word)
                i += 1
                continue
            if word[:2] in table and table[word[:2]].nargs != 0:  # -n4, -Hhost
                name, eq, value = word[:2], "=", word[2:].removeprefix("=")
        if name not in table and name.startswith("--"):
            name = _long_option(table, name)
        if name not in table:
            raise UsageError(f"unknown option {name!r} (poprun's options come before the "
                             "program)")
        action = table[name]
        if action.nargs == 0:
            if eq:
                raise UsageError(f"option {name} takes no value, got {word!r}")
            options.append(name)
            i += 1
            continue
        if not eq:
            if action.nargs == "?":  # booleans: the value is optional
                if i + 1 < len(argv) and argv[i + 1].lower() in _TRUE + _FALSE:
                    value, i = argv[i + 1], i + 1
                else:
                    value = "yes"
            elif i + 1 >= len(argv):
                raise UsageError(f"option {name} needs a value")
            else:
                value, i = argv[i + 1], i + 1
        options.append(f"{name}={value}" if name.startswith("--") else f"{name}{value}")
        i += 1
    return options, []


def find_program(name: str) -> str | None:
    """Where ``name`` is (a file, or a command on ``PATH``), or None. ``python``,
    ``python3``... are always found: poprun runs them with its own interpreter."""
    if os.sep not in name and _PYTHON.match(name):
        return sys.executable
    if os.sep in name:
        return name if os.path.isfile(name) else None
    return shutil.which(name)


def _config_defaults(parser: argparse.ArgumentParser, path: str) -> dict:
    """Option values from an ``--import-config`` file (JSON object of long option names,
    with or without dashes, or argparse names).

    Raises:
        UsageError: the file cannot be read, is not a JSON object, or names an unknown option.
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--import-config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--import-config {path}: expected a JSON object of options")
    dests = {a.dest for a in parser._actions}
    out = {}
    for key, value in data.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in dests or dest in ("help", "import_config", "export_config"):
            raise UsageError(f"--import-config {path}: unknown option {key!r}")
        out[dest] = value
    return out


def parse_args(parser: argparse.ArgumentParser,
               argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """``(options, program)`` from ``argv``; ``--import-config`` values are defaults that
    the command line overrides.

    Raises:
        UsageError: as :func:`split_argv`, or a bad ``--import-config`` file.
        SystemExit: argparse's own exits (``--help``: 0; a bad value: 2, after one line).
    """
    options, program = split_argv(parser, argv)
    args = parser.parse_args(options)
    if args.import_config:
        parser.set_defaults(**_config_defaults(parser, args.import_config))
        args = parser.parse_args(options)
    return args, program


_NOT_EXPORTED = ("help", "version", "version_format", "import_config", "export_config",
                 "overwrite_config", "dry_run")


def export_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The options of ``args`` as ``--export-config`` writes them (long names, no dashes)."""
    out = {}
    for action in parser._actions:
        if action.dest in _NOT_EXPORTED or not action.option_strings or action.dest == "vv":
            continue
        long = next((s for s in action.option_strings if s.startswith("--")),
                    action.option_strings[0])
        out[long.lstrip("-")] = getattr(args, action.dest)
    return out
