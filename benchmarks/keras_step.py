"""A TF-IPU Keras ``fit`` on the emulated POD against plain tf-keras, side by side in one run
(issue 32 item 10).

(a) One replica: ``fit`` of an MLP of about 1 M and about 10 M parameters under
    ``IPUStrategy`` (one IPU) against plain tf-keras ``fit`` of the same model, data,
    optimizer (SGD) and ``steps_per_execution``, in interleaved rounds. Aim: at most 1.15x.
(b) ``poprun -n 2`` with one replica per instance (``PopDistStrategy``), over each of the
    job's transports (MPI, gRPC), against TF's ``MultiWorkerMirroredStrategy`` in 2
    processes (TF_CONFIG on localhost, TF's own gRPC collectives): the same model (1 M),
    per-process batch and step count. Aim: at least as fast.
(c) 4 local replicas in one process (``IPUStrategy``, ``auto_select_ipus=4``) against 4
    ``MultiWorkerMirroredStrategy`` processes.

Times are wall seconds per step (one batch of every replica), the best of ``--rounds``
epochs after a first, untimed one (tracing); a job reports its slowest process. With
``--jobs K`` each job of (b) and (c) runs K times, MultiWorkerMirrored's and ipupod's
alternated, and each side keeps its best (on a shared machine whose load drifts, one job
after the other can favour either side). Only the ratios compare across runs.

    python benchmarks/keras_step.py [--steps 64] [--rounds 3] [--jobs 1] [--json out.json]
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
sys.path[0:1] = [_ROOT]

#: the model sizes: widths of an MLP (about 1.05 M and 10.5 M parameters)
SIZES = {"1M": (512, 1024, 512, 10), "10M": (1024, 2048, 2048, 2048, 10)}
BATCH, SPE = 32, 8


def _model(tf, widths):
    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.layers.Dense(w, activation="relu") for w in widths[1:-1]]
    model = tf.keras.Sequential([tf.keras.Input((widths[0],))] + layers +
                                [tf.keras.layers.Dense(widths[-1])])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), steps_per_execution=SPE,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(widths, batches):
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * BATCH, widths[0])).astype(np.float32)
    y = rng.integers(0, widths[-1], size=batches * BATCH).astype(np.int32)
    return x, y


def _timed_fit(model, x, y, rounds, steps):
    """Best wall seconds per step of ``rounds`` epochs after an untimed one."""
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def one_replica(size, steps, rounds):
    """(a): (ipupod, plain) seconds per step, rounds interleaved."""
    import tensorflow as tf
    from tensorflow.python import ipu
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    widths = SIZES[size]
    x, y = _data(widths, steps)
    with ipu.ipu_strategy.IPUStrategy().scope():
        ours = _model(tf, widths)
    plain = _model(tf, widths)
    ours_s, plain_s = float("inf"), float("inf")
    for _ in range(rounds):
        ours_s = min(ours_s, _timed_fit(ours, x, y, 1, steps))
        plain_s = min(plain_s, _timed_fit(plain, x, y, 1, steps))
    return ours_s, plain_s


def worker(kind, steps, rounds, replicas):
    """One process of (b)/(c): prints ``seconds=<per step>``."""
    import tensorflow as tf
    widths = SIZES["1M"]
    if kind == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        x, y = _data(widths, steps)
        with strategy.scope():
            model = _model(tf, widths)
        # TF's data: each worker its own batches (no auto-sharding of numpy input here)
        seconds = _timed_fit(model, x, y, rounds, steps)
    else:
        import popdist
        import popdist.tensorflow
        from tensorflow.python import ipu
        cfg = ipu.config.IPUConfig()
        if popdist.isPopdistEnvSet():
            popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=1)
            strategy = ipu.distributed.PopDistStrategy()
        else:
            cfg.auto_select_ipus = replicas
            strategy = ipu.ipu_strategy.IPUStrategy()
        cfg.configure_ipu_system()
        local = strategy.num_local_replicas
        x, y = _data(widths, steps * local)
        with strategy.scope():
            model = _model(tf, widths)
        seconds = _timed_fit(model, x, y, rounds, steps)
    print(f"seconds={seconds!r}", flush=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _seconds(outputs):
    found = [float(line.split("=", 1)[1]) for out in outputs for line in out.splitlines()
             if line.startswith("seconds=") or "<stdout>:seconds=" in line
             for line in [line.split("<stdout>:")[-1]]]
    if not found:
        raise RuntimeError("no timing in:\n" + "\n".join(o[-2000:] for o in outputs))
    return max(found)


def mwms(processes, steps, rounds):
    ports = [_free_port() for _ in range(processes)]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(processes):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster,
                                                      "task": {"type": "worker", "index": i}}),
                   TF_CPP_MIN_LOG_LEVEL="2")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "mwms",
                                       "--steps", str(steps), "--rounds", str(rounds)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    return _seconds(outputs)


def ours_job(instances, replicas, steps, rounds, transport=None):
    args = [sys.executable, __file__, "--worker", "ipupod", "--steps", str(steps), "--rounds",
            str(rounds), "--replicas", str(replicas)]
    if instances > 1:
        args = [sys.executable, "-m", "poprun", "-n", str(instances), "--num-replicas",
                str(replicas), "--transport", transport] + args
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    return _seconds([out.stdout + out.stderr])


def _alternated(jobs, runs: dict) -> dict:
    """The best seconds per step of each of ``runs`` (name: job), each run ``jobs`` times,
    in turn."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(jobs):
        for name, job in runs.items():
            best[name] = min(best[name], job())
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1,
                        help="(b), (c): run each job this many times, alternated; keep the best")
    parser.add_argument("--worker", choices=["mwms", "ipupod"])
    parser.add_argument("--only", choices=["a", "b", "c"], action="append")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.steps, args.rounds, args.replicas)
    rows = []
    only = set(args.only or "abc")
    if "a" in only:
        for size in SIZES:
            ours, plain = one_replica(size, args.steps, args.rounds)
            rows.append((f"(a) 1 replica, {size}", "plain tf-keras fit", ours, plain))
    if "b" in only:
        best = _alternated(args.jobs, {
            "mwms": lambda: mwms(2, args.steps, args.rounds),
            "mpi": lambda: ours_job(2, 2, args.steps, args.rounds, "mpi"),
            "grpc": lambda: ours_job(2, 2, args.steps, args.rounds, "grpc")})
        for transport in ("mpi", "grpc"):
            rows.append((f"(b) poprun -n 2 ({transport}), 1 replica each, 1M",
                         "MultiWorkerMirrored x2", best[transport], best["mwms"]))
    if "c" in only:
        best = _alternated(args.jobs, {"mwms": lambda: mwms(4, args.steps, args.rounds),
                                       "ours": lambda: ours_job(1, 4, args.steps, args.rounds)})
        rows.append(("(c) 4 local replicas, 1M", "MultiWorkerMirrored x4", best["ours"],
                     best["mwms"]))
    print(f"{'case':42} {'baseline':26} {'ipupod s/step':>14} {'baseline s/step':>16} "
          f"{'ratio':>7}")
    for case, baseline, ours, theirs in rows:
        print(f"{case:42} {baseline:26} {ours:14.5f} {theirs:16.5f} {ours / theirs:7.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dict(case=c, baseline=b, ipupod_s=o, baseline_s=t, ratio=o / t)
                       for c, b, o, t in rows], f, indent=1)


if __name__ == "__main__":
    main()
