"""Benchmark of the collectives against the raw calls of the transport, in the same run.

    python benchmarks/collectives.py [--instances P] [--transport mpi,grpc] [--gradients]
        [--sizes 4096,1048576 | --max-size BYTES] [--ops OPS] [--quick] [--data-path]
        [--json PATH]

1. P instances (``--instances``, default 2; started here through ``poprun -n P``, one
   replica each) over MPI: every op against the raw mpi4py buffer call doing the same work
   (``Allreduce``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall``, ``Bcast``),
   4 KiB to 64 MiB, interleaved. Over gRPC (``--transport grpc``, ``poprun --launcher
   local``): against torch.distributed's gloo when torch is installed (optional, not a
   dependency of ipupod: ``pip install torch==2.13.0`` for the gloo baseline; its CPU
   tensors share memory with the numpy buffers through ``torch.from_numpy``), else ours
   alone.
   Sizes are nccl-tests' (anchors §5): the allreduce/broadcast buffer, the all-gather
   *output*, the reduce-scatter and all-to-all *input*. algbw = size / time; busbw = algbw x
   2(n-1)/n (allreduce), (n-1)/n (all-gather, reduce-scatter, all-to-all), 1 (broadcast).
   ratio = raw time / ours (targets: >= 0.9 from 1 MiB; 4 KiB: ours <= 3x raw MPI, i.e.
   ratio >= 0.33).

   **The raw MPI baseline makes what ours makes**: every op of ours returns a fresh array
   (TF-IPU semantics: a new tensor per call; the caller may keep it), so the raw call writes
   into a freshly allocated ``np.empty`` result too, kept like ours' results for the rest of
   the repetition (``raw_s``, column ``raw us``). ``Bcast`` overwrites the root's buffer in
   place: the raw root broadcasts its input then copies it into a fresh result (ours returns
   a copy on the root as well), the other ranks receive into a fresh array. Issue 10 allows
   counting that copy for all_gather and broadcast; ipupod counts the fresh result of every
   op the same way, since every op of ours pays for one (allocation and first writes into
   memory that is not in cache). The in-place raw call on preallocated buffers, with no
   fresh result (the baseline before; main's figures), is timed too: ``raw_inplace_s``,
   ``ratio_inplace``, column ``in-place``. gloo (``--transport grpc``) the same way:
   ``raw us`` its call into a fresh result (``benchmarks/_contenders.py``,
   ``RawGloo.fresh``: a new output tensor; all_reduce, in place by nature, on a new copy
   of the input; broadcast as ``Bcast`` above), ``in-place`` its call on preallocated
   tensors (the baseline before).

   ``--data-path`` also times the op's data path alone (``ours_data_s``, ``data_ratio`` =
   raw / data path): each instance runs the steps of the op's plan after the agreement
   (its exchange and finish, ``collectives._engine.plan``) directly, in the same order, outside
   ``strategy.run``, without the call's replica checks, agreement and accounting;
   ``ours - data path`` is the fixed cost of a call. Ours is timed as a program calls it,
   inside a replica function: up to 20 calls in one ``strategy.run``
   (:func:`calls_per_run`), against as many raw calls; the fixed cost of ``strategy.run``
   itself is measured apart (``run_overhead_s``). Each
   round times every contender once, in a shuffled order, each after an untimed barrier
   of the instances, so all see the same state of the machine; a round's time of a
   contender is the mean over the instances (:func:`interleaved_medians`; OSU's
   micro-benchmarks report the same average by default); the medians over rounds are
   compared.
2. ``--gradients``: the ResNet-50-shaped gradient list (161 tensors, 25.6 M floats) summed
   per tensor, as one nest (when the engine fuses nests), raw per tensor, raw fused
   (:func:`gradient_rows`).
3. One instance with 8 local replicas: ``cross_replica_sum`` of 16 MiB per replica against
   a plain numpy copy of the same bytes (8 x 16 MiB); ``--no-local`` skips it.

Prints tables and writes JSON (default ``benchmarks/collectives.json``). Timings are the
median over repetitions (wall seconds, ``time.perf_counter``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._contenders import raw_contender  # noqa: E402
from benchmarks._shapes import resnet50_gradient_shapes, sizes  # noqa: E402
from benchmarks._tables import fmt_size, print_gradients, print_table  # noqa: E402
from benchmarks._timing import (calls_per_run, interleaved_medians,  # noqa: E402
                               median_time, rounds)

OPS = ("cross_replica_sum", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
RAW = {"cross_replica_sum": "Allreduce", "all_gather": "Allgather",
       "reduce_scatter": "Reduce_scatter_block", "all_to_all": "Alltoall",
       "broadcast": "Bcast"}


def bus_factor(op: str, n: int) -> float:
    if op == "cross_replica_sum":
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    return (n - 1) / n


# -- the multi-instance part (runs in every instance) --------------------------------------

def _data_paths(strategy, x: np.ndarray) -> dict:
    """Per op, ``() -> result``: the steps of the op's plan on ``x`` after the agreement
    (its exchange and finish; module docstring, ``--data-path``), as the call's plan runs
    them."""
    import collectives as C
    from collectives._engine.runtime import get_engine

    calls = {"cross_replica_sum": lambda: C.cross_replica_sum(x),
             "all_gather": lambda: C.all_gather(x),
             "reduce_scatter": lambda: C.reduce_scatter(x),
             "all_to_all": lambda: C.all_to_all(x, 0, 0),
             "broadcast": lambda: C.broadcast(x)}
    engine, out = get_engine(), {}
    for op, call in calls.items():
        strategy.run(call)  # (its plan)
        steps = [p for p in engine._plans.values()
                 if p.desc.op == op and p.desc.shape == x.shape][-1].steps
        out[op] = lambda steps=steps: steps.finish((x,), steps.combine((x,)), None, None)
    return out


def worker(transport: str, size_list: list[int], ops: list[str], quick: bool,
           gradients: bool, gloo_port: int, out_path: str, data_path: bool = False) -> None:
    from collectives._engine.allocator import keep_freed_memory
    keep_freed_memory()  # the same allocator for ours and the raw calls, whichever runs first

    import collectives as C
    from collectives.strategies import IPUMultiReplicaStrategy
    from ipu_node import IPUConfig
    from poprun import popdist

    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    raw = raw_contender(transport, gloo_port)
    n, rank = popdist.getNumInstances(), popdist.getInstanceIndex()

    def barrier():
        strategy.run(lambda: C.cross_replica_sum(np.zeros(1, np.float32)))

    def mean_over_instances(times: np.ndarray) -> np.ndarray:
        return strategy.run(lambda: C.all_gather(times))[0].mean(axis=0)

    rows = []
    for size in size_list:
        # float32 elements, a multiple of the instances (the raw all-gather, reduce-scatter
        # and all-to-all split them evenly): at 3 instances 4 KiB is 1023 elements
        count = size // 4 // n * n
        for op in ops:
            x = np.random.default_rng(rank).standard_normal(
                count // n if op == "all_gather" else count).astype(np.float32)
            out = np.empty(count if op != "reduce_scatter" else count // n, np.float32)
            ours = {
                "cross_replica_sum": lambda: C.cross_replica_sum(x),
                "all_gather": lambda: C.all_gather(x),
                "reduce_scatter": lambda: C.reduce_scatter(x),
                "all_to_all": lambda: C.all_to_all(x, 0, 0),
                "broadcast": lambda: C.broadcast(x),
            }[op]
            calls = calls_per_run(size)

            def ours_fn(ours=ours, calls=calls):  # the op as programs call it: in a replica
                strategy.run(lambda: [ours() for _ in range(calls)] and None)

            fns = {"ours": ours_fn}
            if raw is not None:
                if hasattr(raw, "fresh"):
                    fresh_op = raw.fresh(op, x, out)

                    def raw_fresh_fn(fresh_op=fresh_op, calls=calls):
                        _ = [fresh_op() for _ in range(calls)]  # kept, like ours
                    fns["raw"] = raw_fresh_fn
                raw_op = raw.op(op, x, out)

                def raw_fn(raw_op=raw_op, calls=calls):
                    for _ in range(calls):
                        raw_op()
                fns["raw_inplace"] = raw_fn
            if data_path:
                data_op = _data_paths(strategy, x)[op]

                def data_fn(data_op=data_op, calls=calls):
                    _ = [data_op() for _ in range(calls)]
                fns["data"] = data_fn
            for fn in fns.values():  # warm up
                fn()
            barrier()
            medians = interleaved_medians(list(fns.values()),
                                           rounds(size, calls, quick),
                                           raw.barrier if raw is not None else barrier,
                                           mean_over_instances)
            times = {k: t / calls for k, t in zip(fns, medians)}
            t_o = times["ours"]
            t_i = times.get("raw_inplace")
            t_r = times.get("raw", t_i)
            t_d = times.get("data")
            row = {"op": op, "raw": raw.name if raw else None, "size": size, "instances": n,
                   "transport": transport, "ours_s": t_o, "raw_s": t_r,
                   "ours_algbw_GBps": count * 4 / t_o / 1e9,
                   "ours_busbw_GBps": count * 4 / t_o / 1e9 * bus_factor(op, n),
                   "ratio": (t_r / t_o) if t_r else None,
                   "raw_fresh_result": raw is not None and hasattr(raw, "fresh"),
                   "raw_inplace_s": t_i, "ratio_inplace": (t_i / t_o) if t_i else None,
                   "ours_data_s": t_d,
                   "data_ratio": (t_r / t_d) if t_r and t_d else None}
            rows.append(row)
    grads = gradient_rows(strategy, raw, barrier, quick) if gradients else None
    run_overhead = median_time(lambda: strategy.run(lambda: None), 200)
    if rank == 0:
        Path(out_path).write_text(json.dumps({"rows": rows, "gradients": grads,
                                              "run_overhead_s": run_overhead}))


def gradient_rows(strategy, raw, barrier, quick: bool) -> dict:
    """The ResNet-50-shaped gradient list (:func:`resnet50_gradient_shapes`) summed over the
    instances four ways: ours per tensor (161 calls in one ``strategy.run``), ours as one nest
    (one call; fused by the engine where it fuses), raw per tensor (161 raw calls), raw fused
    (the tensors copied into one buffer, one raw all-reduce, copied back out: what Horovod's
    fusion buffer does). Median wall seconds per step."""
    import collectives as C

    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s).astype(np.float32) for s in resnet50_gradient_shapes()]
    total = sum(g.size for g in grads)
    fns = {"ours_per_tensor": lambda: strategy.run(
        lambda: [C.cross_replica_sum(g) for g in grads] and None)}
    from ipu_node import IPUConfig
    # (nests arrive with IPUConfig.optimizations, issue 10's fusion; before it a list would
    # be one array, or an argument error that leaves the engine unusable)
    nest_ok = hasattr(IPUConfig(), "optimizations")
    if nest_ok:
        fns["ours_nest"] = lambda: strategy.run(lambda: C.cross_replica_sum(grads) and None)
    if raw is not None:
        raw_grads = [g.copy() for g in grads]  # gloo sums in place: not ours' inputs
        outs = [np.empty_like(g) for g in grads]
        flat, flat_out = np.empty(total, np.float32), np.empty(total, np.float32)

        def raw_per_tensor():
            for g, o in zip(raw_grads, outs):
                raw.allreduce(g, o)

        def raw_fused():
            np.concatenate([g.reshape(-1) for g in grads], out=flat)
            summed = raw.allreduce(flat, flat_out)
            at = 0
            for o in outs:
                o.reshape(-1)[:] = summed[at:at + o.size]
                at += o.size
        fns["raw_per_tensor"] = raw_per_tensor
        fns["raw_fused"] = raw_fused
    for fn in fns.values():
        fn()
    barrier()
    times = interleaved_medians(list(fns.values()), 3 if quick else 7)
    out = dict(zip(fns, times))
    out.update(tensors=len(grads), floats=total, nest_supported=nest_ok)
    return out


# -- the local part --------------------------------------------------------------------------

def local_part(size: int = 16 << 20, replicas: int = 8, reps: int = 5) -> dict:
    import collectives as C
    from collectives.strategies import IPUMultiReplicaStrategy, PerReplica
    from ipu_node import IPUConfig, reset_ipu_configuration

    cfg = IPUConfig()
    cfg.auto_select_ipus = replicas
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    xs = [np.random.default_rng(r).standard_normal(size // 4).astype(np.float32)
          for r in range(replicas)]
    outs = [np.empty_like(x) for x in xs]
    per = PerReplica(xs)
    strategy.run(C.cross_replica_sum, args=(per,))
    t_ours = median_time(lambda: strategy.run(C.cross_replica_sum, args=(per,)), reps)

    def copy_all():
        for x, o in zip(xs, outs):
            np.copyto(o, x)

    copy_all()
    t_copy = median_time(copy_all, reps)
    reset_ipu_configuration()
    return {"op": "cross_replica_sum", "replicas": replicas, "bytes_per_replica": size,
            "ours_s": t_ours, "numpy_copy_s": t_copy, "ratio": t_copy / t_ours,
            "ours_GBps_per_replica": size / t_ours / 1e9}


# -- driver ----------------------------------------------------------------------------------

def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(transport: str, instances: int, args) -> dict:
    """Start ``instances`` workers through poprun and return rank 0's results."""
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = os.path.join(tmp, "rows.json")
        poprun = Path(sys.executable).parent / "poprun"
        launcher = ["--launcher", "local", "--transport", "grpc"] if transport == "grpc" else []
        command = [str(poprun), "-n", str(instances), *launcher, sys.executable,
                   os.path.abspath(__file__), "--worker", rows_path, "--transport", transport,
                   "--sizes", ",".join(str(s) for s in args.sizes), "--ops", ",".join(args.ops),
                   "--gloo-port", str(_free_port())]
        if args.quick:
            command.append("--quick")
        if args.gradients:
            command.append("--gradients")
        if args.data_path:
            command.append("--data-path")
        subprocess.run(command, check=True, timeout=3600, cwd=ROOT)
        return json.loads(Path(rows_path).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "collectives.json"))
    parser.add_argument("--max-size", type=int, default=64 << 20,
                        help="sizes 4 KiB, 16 KiB, ... up to this many bytes")
    parser.add_argument("--sizes", type=lambda t: [int(v) for v in t.split(",")],
                        help="comma-separated sizes in bytes (instead of --max-size)")
    parser.add_argument("--ops", type=lambda t: t.split(","), default=list(OPS),
                        help=f"comma-separated ops (default: {','.join(OPS)})")
    parser.add_argument("--instances", "-n", type=int, default=2,
                        help="instances of the job (default 2), one replica each")
    parser.add_argument("--transport", default="mpi",
                        help="mpi, grpc or both: mpi,grpc (gRPC against torch gloo when "
                             "torch is installed, else alone)")
    parser.add_argument("--gradients", action="store_true",
                        help="also the ResNet-50-shaped gradient list (161 tensors)")
    parser.add_argument("--no-local", action="store_true",
                        help="skip the one-instance, 8-replica part")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--data-path", action="store_true",
                        help="also time each op's data path alone (no agreement, accounting)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--gloo-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = sizes(args.max_size)
    unknown = sorted(set(args.ops) - set(OPS))
    if unknown:
        parser.error(f"unknown ops {unknown}; known: {', '.join(OPS)}")
    if args.worker:
        worker(args.transport, args.sizes, args.ops, args.quick, args.gradients,
               args.gloo_port, args.worker, args.data_path)
        return 0
    results: dict = {"instances": args.instances}
    for transport in args.transport.split(","):
        if transport not in ("mpi", "grpc"):
            parser.error(f"unknown transport {transport!r}: mpi or grpc")
        job = run_job(transport, args.instances, args)
        results[transport] = job
        print_table(job["rows"])
        if job["gradients"]:
            print_gradients(job["gradients"], transport, args.instances)
        print(f"# strategy.run of a function that does nothing: "
              f"{job['run_overhead_s'] * 1e6:.1f} us")
    if not args.no_local:
        local = local_part()
        results["local"] = local
        print(f"# 1 instance, {local['replicas']} local replicas: cross_replica_sum of "
              f"{fmt_size(local['bytes_per_replica'])} per replica: "
              f"{local['ours_s'] * 1e3:.1f} ms; numpy copy of the same bytes: "
              f"{local['numpy_copy_s'] * 1e3:.1f} ms; ratio copy/ours {local['ratio']:.2f}")
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"# JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
