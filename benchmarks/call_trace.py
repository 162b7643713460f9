"""The time of one collective call, steady and at a signature's first call, and (with
``--list``) the Python functions of ipupod it enters, from the public op down to the
transport's mpi4py (or gRPC) calls.

    python benchmarks/call_trace.py [--instances 2] [--replicas R] [--bytes 2097152]
        [--op cross_replica_sum] [--transport mpi|grpc] [--calls 21] [--list]

Starts ``poprun -n INSTANCES`` (one replica per instance unless ``--replicas``); every
instance calls the op on a float32 input of ``--bytes`` bytes, and instance 0 reports the
wall time per steady call (the median of ``--calls`` calls after a warm-up call, each
timed alone, the slowest local replica's) and of the first call of a new signature (its
plan made then). Wall seconds on this machine: compare runs made side by side.

With ``--list`` it also traces one steady call and one first call (``sys.setprofile`` in
each calling thread: helper threads of large local reductions are not followed; of several
local replicas, the one that led the call, whose trace is the longest, is shown) and prints
every Python function of the project's packages (``collectives``, ``ipu_node``, ``poprun``,
``popdist``, ``launch``, ``protos``) they enter, indented by depth (``module:function``);
numpy's, the standard library's and C functions (mpi4py's) are not listed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This folder holds collectives.py, which would shadow the package of that name.
sys.path[0:1] = [str(ROOT)]
PACKAGES = ("collectives", "ipu_node", "poprun", "popdist", "launch", "protos")


def _module_of(filename: str) -> str | None:
    """The dotted module of a project file, or None for any other file."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if not rel.parts or rel.parts[0] not in PACKAGES or rel.suffix != ".py":
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class Trace:
    """The project calls of one traced stretch of code (module docstring)."""

    def __init__(self):
        # depth, module, function, the caller's (module, function)
        self.calls: list[tuple[int, str, str, tuple | None]] = []
        self._stack: list[tuple | None] = []  # (module, function) of each open frame
        self._modules: dict[str, str | None] = {}

    def _module(self, code) -> str | None:
        found = self._modules.get(code.co_filename, 0)
        if found == 0:
            found = self._modules[code.co_filename] = _module_of(code.co_filename)
        return found

    def __call__(self, frame, event, arg):
        if event == "call":
            module = self._module(frame.f_code)
            here = None if module is None else (module, frame.f_code.co_qualname)
            if here is not None:
                caller = next((m for m in reversed(self._stack) if m is not None), None)
                depth = sum(m is not None for m in self._stack)
                self.calls.append((depth, module, here[1], caller))
            self._stack.append(here)
        elif event == "return" and self._stack:
            self._stack.pop()

    def listing(self) -> list[str]:
        """Every call, indented by depth (``module:function``)."""
        return [f"{'  ' * d}{m}:{f}" for d, m, f, _ in self.calls]


def traced(fn):
    """``(result, Trace)`` of ``fn()`` run under a :class:`Trace` in this thread."""
    trace = Trace()
    sys.setprofile(trace)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, trace


def worker(op: str, nbytes: int, calls: int, out_path: str, list_calls: bool) -> None:
    import numpy as np

    import collectives as C
    from collectives.strategies import IPUMultiReplicaStrategy
    from ipu_node import IPUConfig
    from poprun import popdist

    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    R = popdist.getNumTotalReplicas()
    count = nbytes // 4 // R * R
    call = {"cross_replica_sum": lambda x: C.cross_replica_sum(x),
            "all_gather": lambda x: C.all_gather(x),
            "reduce_scatter": lambda x: C.reduce_scatter(x),
            "all_to_all": lambda x: C.all_to_all(x, 0, 0),
            "broadcast": lambda x: C.broadcast(x)}[op]
    x = np.ones(count, np.float32)
    strategy.run(lambda: C.cross_replica_sum(np.ones(1, np.float32)))  # (the transport)
    strategy.run(lambda: call(x))  # (warm-up: the steady call's plan)

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    steady = sorted(max(strategy.run(lambda: timed(lambda: call(x)))) for _ in range(calls))
    first = np.ones(count + R, np.float32)  # (a signature not seen before)
    fresh = max(strategy.run(lambda: timed(lambda: call(first))))
    listing = {}
    if list_calls:
        second = np.ones(count + 2 * R, np.float32)  # (another new signature)

        def step():
            return (traced(lambda: call(x))[1].listing(),
                    traced(lambda: call(second))[1].listing())

        traces = strategy.run(step)  # (per local replica: the leader's is the longest)
        listing = {"steady": max((t[0] for t in traces), key=len),
                   "first": max((t[1] for t in traces), key=len)}
    if popdist.getInstanceIndex() == 0:
        Path(out_path).write_text(json.dumps({"steady_s": steady[len(steady) // 2],
                                              "first_s": fresh, **listing}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", "-n", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=None,
                        help="replicas of the job (default: one per instance)")
    parser.add_argument("--bytes", type=int, default=2 << 20)
    parser.add_argument("--op", default="cross_replica_sum")
    parser.add_argument("--transport", default="mpi", choices=("mpi", "grpc"))
    parser.add_argument("--calls", type=int, default=21, help="steady calls timed")
    parser.add_argument("--list", action="store_true", help="print every function entered")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.op, args.bytes, args.calls, args.worker, args.list)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "trace.json")
        poprun = Path(sys.executable).parent / "poprun"
        launcher = ["--launcher", "local", "--transport", "grpc"] \
            if args.transport == "grpc" else []
        replicas = ["--num-replicas", str(args.replicas)] if args.replicas else []
        subprocess.run([str(poprun), "-n", str(args.instances), *replicas, *launcher,
                        sys.executable, os.path.abspath(__file__), "--worker", out,
                        "--op", args.op, "--bytes", str(args.bytes), "--calls",
                        str(args.calls), *(["--list"] if args.list else [])],
                       check=True, timeout=600, cwd=ROOT)
        result = json.loads(Path(out).read_text())
    where = (f"{args.op} of {args.bytes} bytes, {args.instances} instances"
             + (f", {args.replicas} replicas" if args.replicas else "")
             + f", {args.transport}")
    print(f"# {where}: a steady call {result['steady_s'] * 1e6:.1f} us (median of "
          f"{args.calls}), the first call of a signature {result['first_s'] * 1e6:.1f} us")
    for title in ("steady", "first"):
        if title in result:
            print(f"# the functions a {title} call enters:")
            print("\n".join(result[title]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
