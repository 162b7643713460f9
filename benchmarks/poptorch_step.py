"""A PopTorch training step on the emulated POD against plain PyTorch, side by side in one run.

(a) One replica: a ``poptorch.trainingModel`` call of ``--di`` steps against the plain
    PyTorch loop doing the same work (forward, loss, backward, SGD with momentum on the same
    micro-batches, the same intra-op threads), for an MLP of about 1 M and about 10 M
    parameters, in interleaved rounds.
(b) ``poprun -n 2`` with one replica per instance against
    ``torch.nn.parallel.DistributedDataParallel`` over gloo in 2 processes: same model,
    per-process batch and step count.
(c) ``replicationFactor(4)`` in one process against 4 DDP processes. A step's gradients go
    to ``cross_replica_sum`` as a list under one name at every step (the collectives fuse it
    per dtype): one plan per fused buffer for the life of the model, where a name with the
    step index made ``--di`` x buffers. Alternating runs of the 4-replica worker (1M, di 10,
    the 2-core VM at load 2-6): best 14.3 ms per step against 15.1 ms before; one flat
    buffer per dtype through the common call was slower (15.6 against 14.8 ms: a result of
    the common call needed a copy of its own, the array handed to a replica being reusable
    by the plan at the next step).
(d) A pipelined model: the MLP of ``--sizes`` cut into two stages of about half the
    parameters each on two IPUs (``poptorch.BeginBlock``, ``PipelinedExecution``), G
    micro-batches per step (``--accumulation``), against the same model unsplit in the plain
    PyTorch loop with the same accumulation (G backward passes into ``.grad``, divided by G,
    one SGD step). Aim: at most 1.15x.
(e) The cost of counting: the modelled time laid on the IPUs' clocks at every step (the
    counts themselves are made once, at compile) as a share of a step of (d), measured twice:
    the replay alone, timed over many steps, and the same model with and without it; and what
    the compile-time count (one forward and backward pass of a micro-batch, with FLOP and
    saved-tensor counting) adds to the first call. Aim: under 2% of a step after the first.

Every DDP process computes with ``max(1, cores // processes)`` intra-op threads, what the
emulation gives each replica (``poptorch._threads``; torchrun's ``OMP_NUM_THREADS=1`` on
this 2-core machine); ``--threads N`` gives every replica, plain loop and DDP process N
(``IPUPOD_TORCH_THREADS``; 1 keeps a loaded machine's OpenMP barriers out of the figures). Times are wall seconds per optimizer step on this machine, the best
of ``--rounds`` rounds (on a shared machine the other processes only ever add time, so the
best round is the least disturbed one; DDP and PopTorch rounds of (b)/(c) each report their
slowest process's best round): only the ratios compare across runs.

    python benchmarks/poptorch_step.py [--steps 60] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0:1] = [_ROOT]  # this folder holds collectives.py: the package comes first

import torch  # noqa: E402

#: the two model sizes: widths of an MLP (about 1.05 M and 10.5 M parameters)
SIZES = {"1M": (512, 1024, 512, 10), "10M": (1024, 2048, 2048, 2048, 10)}


def mlp(widths) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class WithLoss(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        out = self.net(x)
        return out, torch.nn.functional.cross_entropy(out, y)


def batches(widths, rows: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, widths[0], generator=g),
            torch.randint(0, widths[-1], (rows,), generator=g))


# -- (a) one replica ---------------------------------------------------------------------------

def one_replica(size: str, steps: int, rounds: int, di: int, batch: int) -> dict[str, float]:
    import poptorch
    from poptorch._threads import threads_per_replica
    widths = SIZES[size]
    net, ref = mlp(widths), mlp(widths)
    model = poptorch.trainingModel(WithLoss(net), poptorch.Options().deviceIterations(di),
                                   torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1e-3, momentum=0.9)
    x, y = batches(widths, di * batch)
    xs, ys = x.view(di, batch, -1), y.view(di, batch)
    torch.set_num_threads(threads_per_replica(1))
    model(x, y)  # compile

    def plain() -> None:
        for d in range(di):
            ref_opt.zero_grad()
            torch.nn.functional.cross_entropy(ref(xs[d]), ys[d]).backward()
            ref_opt.step()

    plain()
    calls = max(1, steps // di)
    times: dict[str, list[float]] = {"plain": [], "poptorch": []}
    for _ in range(rounds):
        for name, fn in (("plain", plain), ("poptorch", lambda: model(x, y))):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / (calls * di))
    model.destroy()
    return {k: min(v) for k, v in times.items()}


# -- (d), (e) a pipelined model ----------------------------------------------------------------

def _cut(widths) -> tuple[torch.nn.Module, int]:
    """The MLP with a block beginning at the layer that halves its parameters (IPU 1)."""
    import poptorch
    net = mlp(widths)
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]
    total, running = sum(p.numel() for p in net.parameters()), 0
    for i, layer in enumerate(linears):
        running += sum(p.numel() for p in layer.parameters())
        if running >= total / 2:
            poptorch.BeginBlock(linears[min(i + 1, len(linears) - 1)], "second", ipu_id=1)
            return net, i + 1
    raise ValueError("no second stage")


def pipelined(size: str, steps: int, rounds: int, di: int, batch: int,
              G: int) -> dict[str, float]:
    import poptorch
    from poptorch._threads import threads_per_replica
    widths = SIZES[size]
    net, _ = _cut(widths)
    ref = mlp(widths)
    opts = poptorch.Options().deviceIterations(di)
    opts.Training.gradientAccumulation(G)
    model = poptorch.trainingModel(WithLoss(net), opts,
                                   torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=1e-3, momentum=0.9)
    x, y = batches(widths, di * G * batch)
    xs, ys = x.view(di, G, batch, -1), y.view(di, G, batch)
    torch.set_num_threads(threads_per_replica(1))
    start = time.perf_counter()
    model(x, y)  # compile (with the counting pass) and the first call
    first = time.perf_counter() - start

    def plain() -> None:
        for d in range(di):
            ref_opt.zero_grad()
            for g in range(G):
                torch.nn.functional.cross_entropy(ref(xs[d, g]), ys[d, g]).backward()
            with torch.no_grad():
                for p in ref.parameters():
                    p.grad /= G
            ref_opt.step()

    compiled, clock = model._executable, model._clock

    def without_clock():
        model._executable = compiled.replace(clock=None)
        try:
            model(x, y)
        finally:
            model._executable = compiled

    plain()
    calls = max(1, steps // di)
    times: dict[str, list[float]] = {"plain": [], "poptorch": [], "no_clock": []}
    for _ in range(rounds):
        for name, fn in (("plain", plain), ("poptorch", lambda: model(x, y)),
                         ("no_clock", without_clock)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / (calls * di))
    replays = 2000
    start = time.perf_counter()
    for _ in range(replays):
        clock.pipeline(0)
        clock.weight_update(0)
    replay = (time.perf_counter() - start) / replays
    out = {k: min(v) for k, v in times.items()}
    out.update(replay=replay, first_call=first)
    model.destroy()
    return out


# -- (b), (c) several processes: the workers ----------------------------------------------------

def _best_round(step, steps: int, rounds: int) -> float:
    """Seconds per step of ``step()`` (which runs ``per_call`` steps): the best round."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        done = 0
        while done < steps:
            done += step()
        best = min(best, (time.perf_counter() - start) / done)
    return best


def worker_poptorch(size: str, steps: int, di: int, batch: int, replicas: int,
                    rounds: int) -> None:
    import popdist
    import popdist.poptorch
    import poptorch
    widths = SIZES[size]
    net = mlp(widths)
    opts = popdist.poptorch.Options() if popdist.isPopdistEnvSet() else \
        poptorch.Options().replicationFactor(replicas)
    opts.deviceIterations(di)
    model = poptorch.trainingModel(WithLoss(net), opts,
                                   torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9))
    x, y = batches(widths, di * batch * opts.replication_factor,
                   seed=1 + popdist.getInstanceIndex())
    model(x, y)  # compile

    def call() -> int:
        model(x, y)
        return di

    print(json.dumps({"seconds_per_step": _best_round(call, steps, rounds)}), flush=True)


def worker_ddp(size: str, steps: int, batch: int, rank: int, world: int, port: int,
               rounds: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    threads = os.environ.get("IPUPOD_TORCH_THREADS")
    torch.set_num_threads(int(threads) if threads else max(1, torch.get_num_threads() // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    widths = SIZES[size]
    model = DistributedDataParallel(mlp(widths))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = batches(widths, batch, seed=1 + rank)

    def step() -> int:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return 1

    step()
    dist.barrier()
    seconds = _best_round(step, steps, rounds)
    dist.destroy_process_group()
    print(json.dumps({"seconds_per_step": seconds}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slowest(outputs: list[str]) -> float:
    values = [json.loads(line.split(">:")[-1])["seconds_per_step"]
              for out in outputs for line in out.splitlines() if "seconds_per_step" in line]
    if not values:
        raise RuntimeError(f"no figures in the workers' output: {outputs}")
    return max(values)


def _run(cmd: list[str], timeout_s: float = 900) -> str:
    env = {**os.environ, "PYTHONPATH": _ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                            cwd=_ROOT)
    if result.returncode:
        raise RuntimeError(f"{cmd} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def processes(size: str, steps: int, di: int, batch: int, instances: int, replicas: int,
              rounds: int) -> dict[str, float]:
    """(b) instances x 1 replica (replicas == instances) or (c) one instance of `replicas`."""
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--size", size, "--steps", str(steps), "--di", str(di), "--batch", str(batch),
              "--rounds", str(rounds)]
    if instances > 1:
        ours = _run([sys.executable, "-m", "poprun", "-n", str(instances), *me, "--worker",
                     "poptorch", *common, "--replicas", str(replicas)])
    else:
        ours = _run([*me, "--worker", "poptorch", *common, "--replicas", str(replicas)])
    port = _free_port()
    procs = [subprocess.Popen([*me, "--worker", "ddp", *common, "--rank", str(r), "--world",
                               str(replicas), "--port", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=_ROOT,
                              env={**os.environ, "PYTHONPATH": _ROOT})
             for r in range(replicas)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        if p.returncode:
            raise RuntimeError(f"DDP rank failed: {err}")
        outs.append(out)
    return {"ddp": _slowest(outs), "poptorch": _slowest([ours])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds (the best counts)")
    p.add_argument("--di", type=int, default=10, help="device iterations per call")
    p.add_argument("--batch", type=int, default=32, help="micro-batch per replica")
    p.add_argument("--sizes", default="1M,10M")
    p.add_argument("--accumulation", type=int, default=4,
                   help="micro-batches per step of the pipelined case (at least 3)")
    p.add_argument("--only", default="abcde", help="the cases to run (letters)")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads of every replica and process (default: the rule)")
    p.add_argument("--json", default=None)
    p.add_argument("--worker", choices=("poptorch", "ddp"), help=argparse.SUPPRESS)
    p.add_argument("--size", default="1M", help=argparse.SUPPRESS)
    p.add_argument("--replicas", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "poptorch":
        worker_poptorch(args.size, args.steps, args.di, args.batch, args.replicas, args.rounds)
        return 0
    if args.worker == "ddp":
        worker_ddp(args.size, args.steps, args.batch, args.rank, args.world, args.port,
                   args.rounds)
        return 0
    if args.threads:
        os.environ["IPUPOD_TORCH_THREADS"] = str(args.threads)  # before poptorch is imported
        torch.set_num_threads(args.threads)
    rows = []
    for size in args.sizes.split(","):
        if "a" in args.only:
            a = one_replica(size, args.steps, args.rounds, args.di, args.batch)
            rows.append((f"(a) 1 replica, {size}", "plain loop", a["plain"], a["poptorch"]))
        if "b" in args.only:
            b = processes(size, args.steps, args.di, args.batch, 2, 2, args.rounds)
            rows.append((f"(b) poprun -n 2, {size}", "DDP x2 gloo", b["ddp"], b["poptorch"]))
        if "c" in args.only:
            c = processes(size, args.steps, args.di, args.batch, 1, 4, args.rounds)
            rows.append((f"(c) 4 replicas, {size}", "DDP x4 gloo", c["ddp"], c["poptorch"]))
        if "d" in args.only or "e" in args.only:
            d = pipelined(size, args.steps, args.rounds, args.di, args.batch, args.accumulation)
            rows.append((f"(d) 2-stage pipe, {size}", f"plain G={args.accumulation}",
                         d["plain"], d["poptorch"]))
            rows.append((f"(e) clock replay, {size}", "a step of (d)", d["poptorch"],
                         d["replay"]))
            rows.append((f"(e) clock on/off, {size}", "(d) no clock", d["no_clock"],
                         d["poptorch"]))
            rows.append((f"(e) first call, {size}", "a step of (d)", d["poptorch"] * args.di,
                         d["first_call"]))
    print(f"# wall ms per optimizer step, best of {args.rounds} rounds of {args.steps} steps: "
          f"micro-batch {args.batch} per replica, {args.di} device iterations per call, "
          f"{os.cpu_count()} cores, threads per replica "
          f"{args.threads or 'cores // replicas'}")
    print(f"{'case':<24} {'baseline':<12} {'baseline ms':>11} {'poptorch ms':>11} "
          f"{'ratio':>6}")
    for case, base_name, base, ours in rows:
        print(f"{case:<24} {base_name:<12} {base * 1e3:>11.2f} {ours * 1e3:>11.2f} "
              f"{ours / base:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "rows": [
                {"case": c, "baseline": n, "baseline_s": b, "poptorch_s": o,
                 "ratio": o / b} for c, n, b, o in rows]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
