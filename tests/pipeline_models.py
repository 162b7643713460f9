"""Models and oracles shared by the pipelining tests: a 2- or 3-stage MLP written as
``Stage(forward, backward)`` and the plain numpy loop that accumulates the same micro-batches
(reference execution-model.md §3 O1)."""

from __future__ import annotations

import numpy as np

import ipu_node
from ipu_node import Variable
from ipu_node.pipelining_ops import Stage


class ListInfeed:
    """A minimal infeed for one replica: hands out its elements in order."""

    def __init__(self, elements):
        self._it = iter(list(elements))

    def next_element(self):
        return next(self._it)


class ListOutfeed:
    """A minimal outfeed: keeps what was enqueued."""

    outfeed_mode = None

    def __init__(self):
        self.items = []

    def enqueue(self, value):
        self.items.append(value)


def softmax_xent(logits, y):
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return -np.log(p[np.arange(len(y)), y]).mean(), p


def init_weights(seed: int, sizes=(8, 16, 12, 3), dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype)
            for a, b in zip(sizes, sizes[1:])]


def hidden_stage(W: Variable, first: bool = False, flops=None) -> Stage:
    """relu(x @ W); passes the labels through."""

    def forward(h, y):
        z = h @ W.value
        return (np.maximum(z, 0), y), (h, z)

    def backward(saved, d_out):
        h, z = saved
        dz = d_out[0] * (z > 0)
        return {W: h.T @ dz}, None if first else (dz @ W.value.T, None)

    return Stage(forward, backward, flops=flops)


def loss_stage(W: Variable, flops=None) -> Stage:
    """Mean softmax cross-entropy of h @ W; outputs (loss,)."""

    def forward(h, y):
        loss, p = softmax_xent(h @ W.value, y)
        return (loss,), (h, p, y)

    def backward(saved, d_out):
        h, p, y = saved
        d = p.copy()
        d[np.arange(len(y)), y] -= 1
        d *= d_out[0] / len(y)
        return {W: h.T @ d}, (d @ W.value.T, None)

    return Stage(forward, backward, flops=flops)


def mlp_stages(variables):
    """One Stage per weight matrix: hidden stages, then the loss stage."""
    return [hidden_stage(W, first=i == 0) for i, W in enumerate(variables[:-1])] + \
        [loss_stage(variables[-1])]


def grads_of(weights, x, y):
    """The loss and gradients of one micro-batch, as the stages compute them."""
    hs, zs = [x], []
    for w in weights[:-1]:
        zs.append(hs[-1] @ w)
        hs.append(np.maximum(zs[-1], 0))
    loss, p = softmax_xent(hs[-1] @ weights[-1], y)
    d = p.copy()
    d[np.arange(len(y)), y] -= 1
    d *= np.ones_like(np.asarray(loss)) / len(y)
    grads = [hs[-1].T @ d]
    dh = d @ weights[-1].T
    for i in range(len(weights) - 2, -1, -1):
        dz = dh * (zs[i] > 0)
        grads.insert(0, hs[i].T @ dz)
        dh = dz @ weights[i].T
    return loss, grads


def grad_sums(weights, elements):
    """``acc = acc + g_m`` from zeros over ``elements``, m ascending (fixed weights)."""
    acc = [np.zeros_like(w) for w in weights]
    for x, y in elements:
        acc = [a + g for a, g in zip(acc, grads_of(weights, x, y)[1])]
    return acc


def oracle(weights, elements, g: int, repeats: int, lr: float):
    """O1: per repeat, fix W; for m ascending compute the loss and gradients of element
    ``rG+m`` with the same stage functions; ``acc = acc + g_m`` from zeros; ``W -= lr*acc``.
    Returns the final weights and the losses."""
    weights = [w.copy() for w in weights]
    losses = []
    for r in range(repeats):
        chunk = elements[r * g:(r + 1) * g]
        losses += [grads_of(weights, x, y)[0] for x, y in chunk]
        acc = grad_sums(weights, chunk)
        weights = [w - np.float32(lr) * a for w, a in zip(weights, acc)]
    return weights, losses


def make_elements(seed: int, n: int, batch: int = 4, features: int = 8, classes: int = 3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, features)).astype(np.float32),
             rng.integers(0, classes, batch)) for _ in range(n)]


def configure(ipus_per_replica: int, replicas: int = 1, **options):
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = ipus_per_replica * replicas
    cfg.ipus_per_replica = ipus_per_replica
    for key, value in options.items():
        if key == "compute_efficiency":
            cfg.execution.compute_efficiency = value
        else:
            setattr(cfg, key, value)
    return cfg.configure_ipu_system()


def in_replica(fn, *args):
    """``fn(*args)`` in local replica 0 of the configured system."""
    return ipu_node.get_system().run_replicas(fn, [args], [{}])[0]
