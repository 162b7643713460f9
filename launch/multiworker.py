"""Start a TF_CONFIG cluster on this machine, for a quick try of multi-worker programs.

    python -m launch.multiworker -n 2 train.py [args...]
    python -m launch.multiworker -n 2 python -u train.py [args...]

A program ending in ``.py`` runs with this Python (as torchrun runs its script).

Picks ``n`` free localhost ports, gives worker i the TF_CONFIG of that cluster (worker 0's
address serves the coordinator) and a random job token (``IPUPOD_JOB_TOKEN``), and runs the
workers with poprun's local launcher: tagged output, signal forwarding, one failure stops the
job. The workers do not get ``POPDIST_*`` variables: they find their place in the job from
TF_CONFIG alone, as they would on separate machines.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import socket
import sys
from typing import Callable

from launch import env as envnames
from launch.errors import InstanceFailedError, LaunchError
from launch.local import LocalBackend
from launch.plan import InstancePlacement, LaunchPlan, make_plan
from launch.tf_config import make_tf_config


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago (a later bind may still race)."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def tf_config_env(addresses: list[str], token: str) -> Callable[..., dict]:
    """An ``instance_env`` for :class:`LocalBackend`: TF_CONFIG, token and error file only."""
    def instance_env(plan: LaunchPlan, placement: InstancePlacement, error_file: str) -> dict:
        return {envnames.TF_CONFIG: make_tf_config(addresses, placement.index),
                envnames.JOB_TOKEN: token, envnames.INSTANCE_INDEX: str(placement.index),
                envnames.ERROR_FILE: error_file}
    return instance_env


def main(argv: list[str] | None = None) -> int:
    """Run the cluster; returns the exit code (2: bad arguments)."""
    parser = argparse.ArgumentParser(prog="python -m launch.multiworker", description=(
        "Run a program as a TF_CONFIG cluster of workers on localhost ports."))
    parser.add_argument("-n", "--num-workers", type=int, default=2, metavar="N")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    logging.basicConfig(format="MULTIWORKER [%(levelname).1s] %(message)s",
                        level=logging.WARNING - 10 * min(args.verbose, 1))
    command = [args.program, *args.args]
    if args.program.endswith(".py"):
        command.insert(0, "python")  # a bare "python" is this interpreter (launch.mpirun)
    try:
        plan = make_plan(command, args.num_workers, transport="grpc", launcher="local")
    except ValueError as exc:
        sys.stderr.write(f"multiworker: error: {exc}\n")
        return 2
    addresses = [f"localhost:{p}" for p in free_ports(args.num_workers)]
    logging.getLogger(__name__).info("cluster: %s", addresses)
    backend = LocalBackend(instance_env=tf_config_env(addresses, secrets.token_hex(16)))
    try:
        return backend.run(plan)
    except LaunchError as exc:
        sys.stderr.write(f"multiworker: error: {exc}\n")
        return 1
    except InstanceFailedError as exc:
        sys.stderr.write(f"multiworker: {exc}; the other workers were stopped\n")
        cause = exc.root_cause
        return cause.exit_code or (128 + cause.signal if cause.signal else 1)


if __name__ == "__main__":
    sys.exit(main())
