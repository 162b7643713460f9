"""Train a multilayer perceptron on scikit-learn's handwritten digits, data-parallel over the
replicas of an ipupod job.

    poprun -n 4 python examples/train_digits.py            # 4 instances, 1 replica each
    poprun -n 2 --num-replicas 4 python examples/train_digits.py
    python examples/train_digits.py                         # 1 instance, 1 replica

Every replica computes the loss and gradients of its own shard of each global batch (the
model is this file's own numpy forward and backward pass); ``cross_replica_sum`` adds the
gradients of all replicas, so each step equals one step on the whole global batch. The last
line printed is ``test_accuracy=<float>``.

Checkpoints: after every epoch each instance writes ``instance_<i>.npz`` in
``--checkpoint-dir``: parameters, momentum buffers (``velocity_<name>``), epochs and steps done, the
losses so far, the last epoch's data order and the state of the generator that draws the data
order. ``--resume`` continues from it (from scratch when there is none), so a run stopped
after any epoch (``--stop-after-epoch K``, or a kill) and resumed writes checkpoints with the
same bytes as a run that was never stopped, at every layout. Writes are atomic: a temporary
file in the same directory, fsync, rename, fsync of the directory; the temporary files of a
write that was killed are removed by the next run. The instances of a job must resume from
checkpoints of the same epoch (they write the same bytes; a kill between two instances'
writes is detected and named).
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import signal
import sys
import zipfile

import numpy as np
from tqdm import tqdm

import ipu_node
from collectives import cross_replica_mean, cross_replica_sum
from collectives.strategies import IPUMultiReplicaStrategy, PerReplica
from poprun import popdist

PARAM_NAMES = ("W1", "b1", "W2", "b2")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--global-batch-size", type=int, default=64,
                   help="samples per step over all replicas (divisible by the replicas)")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--checkpoint-dir", default=os.path.join("runs", "train_digits"))
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir (if there is one)")
    p.add_argument("--stop-after-epoch", type=int, default=None, metavar="K",
                   help="stop once K epochs are done (the checkpoint is written); resume later "
                        "with --resume")
    return p.parse_args(argv)


def load_data(seed: int, dtype):
    """Digits (1797 8x8 images, pixel values 0..16) scaled to [0, 1]; a fixed 80/20 split."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = (x[order] / 16.0).astype(dtype), y[order]
    n_test = len(x) // 5
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def init_params(seed: int, n_in: int, hidden: int, n_out: int, dtype) -> dict:
    rng = np.random.default_rng(seed + 1)
    return {"W1": (rng.standard_normal((n_in, hidden)) * np.sqrt(2.0 / n_in)).astype(dtype),
            "b1": np.zeros(hidden, dtype),
            "W2": (rng.standard_normal((hidden, n_out)) * np.sqrt(1.0 / hidden)).astype(dtype),
            "b2": np.zeros(n_out, dtype)}


def forward(params: dict, x: np.ndarray):
    h = np.maximum(x @ params["W1"] + params["b1"], 0)
    logits = h @ params["W2"] + params["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return h, p / p.sum(axis=1, keepdims=True)


def loss_and_grads(params: dict, x: np.ndarray, y: np.ndarray, scale: float):
    """Mean cross-entropy of the shard, and its gradients times ``scale``
    (shard size / global batch size, so that summing over replicas gives the global mean)."""
    h, prob = forward(params, x)
    n = len(x)
    loss = -np.log(prob[np.arange(n), y] + 1e-12).mean()
    d_logits = prob
    d_logits[np.arange(n), y] -= 1
    d_logits *= scale / n
    d_h = (d_logits @ params["W2"].T) * (h > 0)
    grads = {"W1": x.T @ d_h, "b1": d_h.sum(0), "W2": h.T @ d_logits, "b2": d_logits.sum(0)}
    return loss, grads


#: test hook: SIGKILL this process after the temporary file of a checkpoint write is
#: complete, before it is renamed (a kill during the write)
KILL_DURING_WRITE_ENV = "TRAIN_DIGITS_TEST_KILL_DURING_WRITE"
#: a fixed time stamp for the members of a checkpoint, so equal arrays give equal bytes
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _npz_bytes(arrays: dict) -> bytes:
    """``arrays`` as an .npz (readable by ``np.load``) whose bytes depend on the arrays
    only (``np.savez`` stamps each member with the current time)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(arrays[name]), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME), member.getvalue())
    return buffer.getvalue()


def _temp_prefix(instance: int) -> str:
    return f".instance_{instance}.npz.tmp-"


def remove_stale_temporaries(directory: str, instance: int) -> list[str]:
    """Remove the temporary files a killed checkpoint write of ``instance`` left."""
    stale = glob.glob(os.path.join(glob.escape(directory), _temp_prefix(instance) + "*"))
    for path in stale:
        os.unlink(path)
    return stale


def save_checkpoint(directory: str, instance: int, arrays: dict) -> str:
    """Write ``instance_<i>.npz`` atomically: a temporary file in the same directory, fsync,
    rename over the old checkpoint, fsync of the directory (so the rename survives a crash).
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"instance_{instance}.npz")
    tmp = os.path.join(directory, f"{_temp_prefix(instance)}{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_npz_bytes(arrays))
            f.flush()
            os.fsync(f.fileno())
        kill_at = os.environ.get(KILL_DURING_WRITE_ENV)
        if kill_at is not None and "epoch" in arrays and kill_at == str(int(arrays["epoch"])):
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(directory: str, instance: int) -> dict | None:
    """The arrays of ``instance_<i>.npz``, or None when there is none."""
    path = os.path.join(directory, f"instance_{instance}.npz")
    if not os.path.exists(path):
        return None
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _rng_state(rng: np.random.Generator) -> np.ndarray:
    return np.frombuffer(json.dumps(rng.bit_generator.state).encode(), np.uint8)


def _set_rng_state(rng: np.random.Generator, state: np.ndarray) -> None:
    rng.bit_generator.state = json.loads(state.tobytes().decode())


def main(argv=None) -> float:
    args = parse_args(argv)
    dtype = np.dtype(args.dtype)
    cfg = ipu_node.IPUConfig()
    popdist.set_ipu_config(cfg, ipus_per_replica=popdist.getNumIpusPerReplica())
    cfg.configure_ipu_system()
    strategy = IPUMultiReplicaStrategy()
    replicas = strategy.num_replicas_in_sync
    instance, offset = popdist.getInstanceIndex(), popdist.getReplicaIndexOffset()
    if args.global_batch_size % replicas:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} is not divisible by "
                         f"the {replicas} replicas")
    shard = args.global_batch_size // replicas
    (x_train, y_train), (x_test, y_test) = load_data(args.seed, dtype)

    with strategy.scope():
        params = strategy.broadcast(init_params(args.seed, x_train.shape[1], args.hidden,
                                                10, dtype))
        velocity = {k: np.zeros_like(v) for k, v in params.items()}

        def step(params, velocity, x, y):
            loss, grads = loss_and_grads(params, x, y, shard / args.global_batch_size)
            # the gradients as one nest: fused into one buffer per dtype by the collective
            grads = cross_replica_sum(grads, name="gradients")
            lr = dtype.type(args.learning_rate)
            velocity = {k: args.momentum * velocity[k] - lr * grads[k] for k in PARAM_NAMES}
            new_params = {k: params[k] + velocity[k] for k in PARAM_NAMES}
            return cross_replica_mean(np.float64(loss), name="loss"), new_params, velocity

        steps = len(x_train) // args.global_batch_size
        state = _start_state(args, instance, strategy, params, velocity)
        params, velocity, losses = state["params"], state["velocity"], state["losses"]
        rng, accuracy = state["rng"], state["accuracy"]
        last = args.epochs if args.stop_after_epoch is None else \
            min(args.epochs, args.stop_after_epoch)
        # On stdout, so that the epoch lines, the bar and the final line keep their order.
        bar = tqdm(total=args.epochs * steps, initial=len(losses), disable=instance != 0,
                   mininterval=1.0, desc="training", unit="step", file=sys.stdout)
        for epoch in range(state["epoch"], last):
            order = rng.permutation(len(x_train))
            for s in range(steps):
                batch = order[s * args.global_batch_size:(s + 1) * args.global_batch_size]
                mine = [batch[(offset + r) * shard:(offset + r + 1) * shard]
                        for r in range(strategy.num_local_replicas)]
                results = strategy.run(step, args=(
                    params, velocity, PerReplica([x_train[i] for i in mine]),
                    PerReplica([y_train[i] for i in mine])))
                loss, params, velocity = results[0]
                losses.append(float(loss))
                bar.update()
            accuracy = float((forward(params, x_test)[1].argmax(1) == y_test).mean())
            save_checkpoint(args.checkpoint_dir, instance, {
                **params, **{f"velocity_{k}": velocity[k] for k in PARAM_NAMES},
                "epoch": np.int64(epoch + 1),
                "step": np.int64(len(losses)), "losses": np.array(losses),
                "test_accuracy": np.array(accuracy), "data_order": order,
                "rng_state": _rng_state(rng)})
            if instance == 0:
                bar.write(f"epoch {epoch + 1}/{args.epochs} loss={np.mean(losses[-steps:]):.6f}"
                          f" test_accuracy={accuracy:.4f}")
        bar.close()

    if instance == 0:
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    return accuracy


def _start_state(args, instance: int, strategy, params: dict, velocity: dict) -> dict:
    """Where training starts: from scratch, or (``--resume``) from this instance's
    checkpoint, after checking that every instance resumes from the same epoch."""
    remove_stale_temporaries(args.checkpoint_dir, instance)
    rng = np.random.default_rng([args.seed, 2])   # draws each epoch's data order
    state = {"params": params, "velocity": velocity, "losses": [], "rng": rng,
             "accuracy": float("nan"), "epoch": 0}
    saved = load_checkpoint(args.checkpoint_dir, instance) if args.resume else None
    if saved is not None:
        _set_rng_state(rng, saved["rng_state"])
        state.update(params={k: saved[k] for k in PARAM_NAMES},
                     velocity={k: saved[f"velocity_{k}"] for k in PARAM_NAMES},
                     losses=[float(v) for v in saved["losses"]], epoch=int(saved["epoch"]),
                     accuracy=float(saved["test_accuracy"]))
        if len(state["losses"]) != int(saved["step"]):
            raise SystemExit(f"checkpoint of instance {instance} in {args.checkpoint_dir}: "
                             f"{len(state['losses'])} losses for {int(saved['step'])} steps")
    if args.resume:
        _check_same_epoch(strategy, state["epoch"], args.checkpoint_dir)
    return state


def _check_same_epoch(strategy, epoch: int, directory: str) -> None:
    """Every replica resumes from ``epoch`` (a kill between two instances' checkpoint
    writes leaves them one epoch apart: named, instead of training on diverged states)."""
    def count(e):
        return cross_replica_sum(np.array([e, e * e, 1.0]), name="resume-epoch")
    total, squares, n = strategy.run(count, args=(float(epoch),))[0]
    if total * total != squares * n:   # not all equal
        raise SystemExit(f"the instances' checkpoints in {directory} are at different epochs "
                         f"(this one: {epoch}; mean {total / n:g}): a kill between two "
                         "instances' writes? Remove the newer ones and --resume again")


if __name__ == "__main__":
    main()
