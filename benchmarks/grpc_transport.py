"""Benchmark: cross_replica_sum over the gRPC transport between 2 instances, with the
same-host shared-memory path and without it (IPUPOD_GRPC_SHM=0), against a raw grpcio byte
stream between the same two processes, and against torch.distributed's gloo all_reduce when
torch is installed. Same run, same machine; medians over --runs, ratios printed and saved.

    python benchmarks/grpc_transport.py [--out results.json] [--max-mib 64] [--runs 3]

Algorithm bandwidth (nccl-tests' algbw) = tensor bytes / time of one all-reduce; the raw
stream moves the same bytes per process as the gRPC all-reduce does between 2 instances
(each sends its whole tensor's worth: half in the reduce-scatter, half in the all-gather),
both directions at once, in 1 MiB chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KIB = 1 << 10
RAW_METHOD = "/bench.Raw/Stream"


def _iters(nbytes: int) -> int:
    return max(3, min(50, (256 << 20) // max(nbytes, 1) // 8))


def _timed(fn, iters: int) -> float:
    """Median wall seconds of ``fn()`` after one warm-up call."""
    fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _raw_server():
    import grpc
    from protos import ServingExecutor, server_options

    received = threading.Condition()
    state = {"bytes": 0}

    def stream(request_iterator, context):
        n = 0
        for chunk in request_iterator:
            n += len(chunk)
        with received:
            state["bytes"] += n
            received.notify_all()
        return b""

    handler = grpc.method_handlers_generic_handler("bench.Raw", {
        "Stream": grpc.stream_unary_rpc_method_handler(stream, None, None)})
    server = grpc.server(ServingExecutor(4, "raw"), options=server_options())
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, received, state


def worker(rank: int, coordinator: str, token: str, sizes: list[int], gloo_port: int,
           only_grpc: bool) -> dict:
    from collectives._engine.allocator import keep_freed_memory
    keep_freed_memory()  # the same allocator for ours, raw grpcio and gloo, whichever runs first
    import grpc
    from collectives import cross_replica_sum
    from collectives.strategies import IPUMultiReplicaStrategy
    from ipu_node import IPUConfig
    from protos import channel_options

    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    mrd = cfg.experimental.multi_replica_distribution
    mrd.process_count, mrd.process_index, mrd.transport = 2, rank, "grpc"
    mrd.coordinator_address, mrd.job_token = coordinator, token
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    transport = strategy._engine.transport
    results: dict = {"grpc": {}, "raw": {}, "gloo": {}}

    for n in sizes:
        x = np.random.default_rng(rank).standard_normal(n // 4).astype(np.float32)
        results["grpc"][n] = _timed(lambda: strategy.run(lambda: cross_replica_sum(x)),
                                    _iters(n))
    results["shm_bytes_sent"] = transport.shm_bytes_sent
    if only_grpc:
        return results

    # raw grpcio: both processes stream n bytes to each other at once
    server, port, received, state = _raw_server()
    ports = strategy.run(lambda: cross_replica_sum(np.array([port if rank == 0 else 0,
                                                             port if rank == 1 else 0])))[0]
    peer_port = int(ports[1 - rank])
    channel = grpc.insecure_channel(f"127.0.0.1:{peer_port}", options=channel_options())
    send = channel.stream_unary(RAW_METHOD, request_serializer=None,
                                response_deserializer=None)
    expected = [0]
    for n in sizes:
        data = np.random.default_rng(rank).integers(0, 255, n, dtype=np.uint8)

        counter = [0]

        def timed_once():
            # the barrier is outside the timing
            transport.barrier(f"raw-{n}-{counter[0]}")
            counter[0] += 1
            start = time.perf_counter()
            # the bytes the peer will have sent after this round (the peer may start first)
            expected[0] += n
            target = expected[0]
            call = send.future((data[i:i + (1 << 20)].tobytes()
                                for i in range(0, n, 1 << 20)))
            with received:
                while state["bytes"] < target:
                    received.wait(1)
            call.result()
            return time.perf_counter() - start

        timed_once()
        results["raw"][n] = statistics.median(timed_once() for _ in range(_iters(n)))

    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        results["gloo"] = None
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}",
                                rank=rank, world_size=2)
        for n in sizes:
            t = torch.from_numpy(np.random.default_rng(rank).standard_normal(n // 4)
                                 .astype(np.float32))
            results["gloo"][n] = _timed(lambda: dist.all_reduce(t), _iters(n))
        dist.destroy_process_group()
    server.stop(0)
    return results


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/grpc_transport.json")
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3, help="medians over this many runs")
    parser.add_argument("--only-grpc", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--gloo-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [4 * KIB << (2 * k) for k in range(12)
             if args.min_kib * KIB <= (4 * KIB << (2 * k)) <= args.max_mib << 20]
    if args.worker is not None:
        res = worker(args.worker, args.coordinator, args.token, sizes, args.gloo_port,
                     args.only_grpc)
        if args.worker == 0:
            print("RESULT " + json.dumps(res))
        return 0

    runs = []
    for run in range(args.runs):
        shm = _pair(args, shm=True)
        pure = _pair(args, shm=False)
        if shm is None or pure is None:
            print("a worker failed", file=sys.stderr)
            return 1
        if not shm["shm_bytes_sent"] or pure["shm_bytes_sent"]:
            print(f"the shared-memory path was {'not ' if shm['shm_bytes_sent'] else ''}used "
                  "where it should (not) be", file=sys.stderr)
            return 1
        runs.append({"shm": shm["grpc"], "pure": pure["grpc"], "raw": shm["raw"],
                     "gloo": shm["gloo"]})
        print(f"run {run + 1} of {args.runs} done", file=sys.stderr)
    rows = []
    print(f"{'size':>9} {'shm GB/s':>9} {'grpc GB/s':>10} {'raw GB/s':>9} {'gloo GB/s':>10} "
          f"{'shm/gloo':>9} {'grpc/gloo':>10}")
    for n in sizes:
        key = str(n)
        secs = {k: statistics.median(r[k][key] for r in runs)
                for k in ("shm", "pure", "raw")}
        secs["gloo"] = statistics.median(r["gloo"][key] for r in runs) if runs[0]["gloo"] \
            else None
        bw = {k: (n / v / 1e9 if v else None) for k, v in secs.items()}
        rows.append({"bytes": n, "shm_algbw_GBps": bw["shm"], "grpc_algbw_GBps": bw["pure"],
                     "raw_stream_GBps": bw["raw"], "gloo_algbw_GBps": bw["gloo"],
                     "shm_over_gloo": bw["shm"] / bw["gloo"] if bw["gloo"] else None,
                     "grpc_over_gloo": bw["pure"] / bw["gloo"] if bw["gloo"] else None,
                     "shm_over_raw": bw["shm"] / bw["raw"], "grpc_over_raw": bw["pure"] / bw["raw"],
                     "shm_s": secs["shm"], "grpc_s": secs["pure"], "raw_s": secs["raw"],
                     "gloo_s": secs["gloo"],
                     "per_run_s": {k: [r[k][key] if r[k] else None for r in runs]
                                   for k in ("shm", "pure", "raw", "gloo")}})
        label = f"{n // KIB} KiB" if n < 1 << 20 else f"{n >> 20} MiB"
        gl = bw["gloo"]
        gloo_text = f"{gl:10.3f} {bw['shm'] / gl:9.2f} {bw['pure'] / gl:10.2f}" if gl \
            else f"{'n/a':>10} {'n/a':>9} {'n/a':>10}"
        print(f"{label:>9} {bw['shm']:9.3f} {bw['pure']:10.3f} {bw['raw']:9.3f} {gloo_text}")
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "runs": args.runs,
            "note": "algbw = tensor bytes / all-reduce seconds, 2 processes on one host; "
                    "shm: ours with the same-host shared-memory path, grpc: ours with "
                    "IPUPOD_GRPC_SHM=0; seconds are medians over the runs"}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"saved {args.out}")
    return 0


def _pair(args, *, shm: bool) -> dict | None:
    """Run the two workers once (ours with or without shared memory; raw and gloo with);
    worker 0's results, or None if a worker failed."""
    from launch.coordinator import CoordinatorServer
    token = secrets.token_hex(8)
    server = CoordinatorServer(2, token)
    gloo_port = _free_port()
    env = {**os.environ, "IPUPOD_GRPC_SHM": "1" if shm else "0"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), "--coordinator",
                               server.address, "--token", token, "--gloo-port", str(gloo_port),
                               "--max-mib", str(args.max_mib), "--min-kib", str(args.min_kib)]
                              + ([] if shm else ["--only-grpc"]),
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=1200)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
        server.stop(0)
    if any(p.returncode for p in procs):
        return None
    return json.loads(next(l for l in outs[0].splitlines() if l.startswith("RESULT "))[7:])


if __name__ == "__main__":
    sys.exit(main())
