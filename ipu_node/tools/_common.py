"""What the gc-* tools share: the ``--system`` option and error reporting."""

from __future__ import annotations

import argparse
import sys

from ipu_node import env
from ipu_node.errors import IPUError
from ipu_node.hardware.systems import SYSTEM_NAMES, SystemModel, get_system_model

#: Exit status of a tool given bad input (argparse uses the same).
EXIT_USAGE = 2


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argument parser with ``--system NAME``."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--system", default=None, metavar="NAME",
                   help=f"emulated system: {', '.join(SYSTEM_NAMES)} "
                        f"(default: ${env.IPUPOD_SYSTEM}, else {env.DEFAULT_SYSTEM})")
    return p


def parse(p: argparse.ArgumentParser,
          argv: list[str] | None) -> tuple[argparse.Namespace, SystemModel | None]:
    """``(args, model of --system)``; the model is None after printing the error (unknown
    system) to stderr: the tool then returns :data:`EXIT_USAGE`."""
    args = p.parse_args(argv)
    return args, model_or_none(p.prog, args.system)


def model_or_none(prog: str, name: str | None) -> SystemModel | None:
    """The model, or None after printing the error (unknown system) to stderr."""
    try:
        return get_system_model(name)
    except IPUError as exc:
        fail(prog, exc)
        return None


def fail(prog: str, exc: BaseException) -> int:
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return EXIT_USAGE
