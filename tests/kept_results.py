"""Results a replica keeps: every array a collective hands a replica is the replica's own.

A plan is made once per call signature and runs every later call of it; where it reused a
buffer for what it hands out, a result kept from call k would change at call k+1. The check
here calls every op (and a fused nest) several times on one signature, with inputs that
differ at every call, keeps every result with a copy of its bytes, and at the end finds
each kept result unchanged and sharing no memory with another replica's or another call's
result, nor with an input. Sizes: one small (carried in the agreement between instances),
one past CARRIED_MAX_BYTES (exchanged). Shared by the in-process tests and the per-rank
suite (any layout).
"""

from __future__ import annotations

import numpy as np

import collectives as C
from collectives.transports.base import CARRIED_MAX_BYTES

#: calls a replica makes on each signature (the plan's first call and its reuses)
CALLS = 3

#: every op once, by name: ``call(x)`` for an input ``x`` of 1-D float32
OPS = {
    "cross_replica_sum": lambda x: C.cross_replica_sum(x),
    "cross_replica_mean": lambda x: C.cross_replica_mean(x),
    "cross_replica_reduce MAX": lambda x: C.cross_replica_reduce(x, "MAX"),
    "all_gather": lambda x: C.all_gather(x),
    "reduce_scatter": lambda x: C.reduce_scatter(x),
    "all_to_all": lambda x: C.all_to_all(x, 0, 0),
    "broadcast": lambda x: C.broadcast(x),
    "nest cross_replica_sum": lambda x: C.cross_replica_sum([x, x[:3] * 2, x[:1].sum()]),
    "nest reduce_scatter": lambda x: C.reduce_scatter([x, x[:5]]),
    "nest all_gather": lambda x: C.all_gather((x[:4], x)),
}


def sizes(num_replicas: int) -> tuple[int, int]:
    """Elements of the two inputs: small (carried), and past CARRIED_MAX_BYTES; each a
    multiple of the replica count (all_to_all splits by it)."""
    big = (CARRIED_MAX_BYTES // 4) * 2
    return 8 * num_replicas, big - big % num_replicas


def _arrays(result) -> list[np.ndarray]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def check_kept_results(strategy, runs: int = 2) -> None:
    """Every op of :data:`OPS` at both :func:`sizes`, :data:`CALLS` times per ``strategy.run``
    and ``runs`` runs: every result kept is unchanged at the end, and owns its memory
    (shares none with another result, of any replica or call, nor with an input)."""
    R = strategy.num_replicas_in_sync
    kept: list = []  # (what, replica, call, array, its bytes then)
    inputs: list = []

    def step(run: int):
        r = int(C.replication_index())
        mine, fed = [], []
        for n in sizes(R):
            for what, call in OPS.items():
                for k in range(CALLS):
                    x = np.arange(n, dtype=np.float32) * (r + 1) + 100 * (run * CALLS + k)
                    fed.append(x)
                    for t, a in enumerate(_arrays(call(x))):
                        mine.append((f"{what} n={n} [{t}]", r, (run, k), a, a.tobytes()))
        return mine, fed

    for run in range(runs):
        for mine, fed in strategy.run(step, args=(run,)):
            kept += mine
            inputs += fed
    for what, r, call, a, then in kept:
        assert a.tobytes() == then, \
            f"{what}: replica {r}'s result of call {call} changed after it was handed out"
    # (each replica owns what it is handed: no two results, nor a result and an input,
    # share memory; by address range, so a view into a plan's buffer is found too)
    spans = sorted([(a.__array_interface__["data"][0], a.nbytes, f"{w} replica {r} call {c}")
                    for w, r, c, a, _ in kept if isinstance(a, np.ndarray) and a.nbytes]
                   + [(x.__array_interface__["data"][0], x.nbytes, "an input")
                      for x in inputs if x.nbytes])
    for (lo, size, what), (lo2, _, other) in zip(spans, spans[1:]):
        assert lo + size <= lo2, f"{what} shares memory with {other}"
