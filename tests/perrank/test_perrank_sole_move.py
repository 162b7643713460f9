"""The prepared large calls of a one-replica instance (collectives._sole_move,
collectives._sole_reduce), run by every instance like test_perrank_collectives.py: the
all-reduces, reduce_scatter, all_gather, all_to_all and broadcast too large for their
agreement give the bytes of the general path and count the same bytes sent, and a wait's
text names the call's number. For the reductions the general path is
collectives._algorithms' own; for the data movement, _movement's one-replica functions make
the same classes at each call, so there the test checks that a move kept from call to call
gives what a new one does (test_perrank_large.py checks the bytes against numpy). On layouts of several
replicas per instance there is no such path, and from 3 instances over MPI calls of
``EARLY_MIN_BYTES`` or more are posted before their agreement instead
(test_perrank_early.py): there the tests check only what applies."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as C
from collectives import _algorithms, _dispatch, _exchange, _movement
from collectives._eager import EARLY_MIN_BYTES
from collectives._runtime import get_engine
from collectives.groups import consecutive
from collectives.operators import CollectiveOperator
from collectives.transports.base import EAGER_MAX_BYTES
from poprun import popdist

pytestmark = pytest.mark.skipif(not popdist.isPopdistEnvSet(),
                                reason="per-rank suite: run under poprun")

#: elements of a float32 input past the eager limit (so the call moves its data after
#: its agreement), divisible by every group size up to 4 and by 6, 8, 12 and 16
_N = (EAGER_MAX_BYTES // 4 // 48 + 1) * 48

_ADD, _MIN = CollectiveOperator.ADD, CollectiveOperator.MIN

_OPS = {
    "cross_replica_sum": (lambda x: C.cross_replica_sum(x),
                          lambda e, d, x, g: _algorithms.allreduce(e, d, [x], _ADD, g)),
    "cross_replica_min": (lambda x: C.cross_replica_reduce(x, _MIN),
                          lambda e, d, x, g: _algorithms.allreduce(e, d, [x], _MIN, g)),
    "reduce_scatter": (lambda x: C.reduce_scatter(x),
                       lambda e, d, x, g: _algorithms.reduce_scatter(e, d, [x], _ADD, g)),
    "all_gather": (lambda x: C.all_gather(x),
                   lambda e, d, x, g: _movement.all_gather(e, d, [x], g)),
    "all_to_all": (lambda x: C.all_to_all(x, 0, 0),
                   lambda e, d, x, g: _movement.all_to_all(e, d, [x], g, 0, 0)),
    "broadcast": (lambda x: C.broadcast(x),
                  lambda e, d, x, g: _movement.broadcast(e, d, [x], g, 0)),
}


#: the op under which a call is kept (its plan's key and its ledger entry)
_KEYS = {"cross_replica_min": "cross_replica_reduce"}


def _plan(op: str, x: np.ndarray):
    """The common-call plan of ``op`` on ``x``'s dtype and shape (made by its first call)."""
    for (key, dtype, shape), (_, plan) in _dispatch.sole_plans.items():
        if key[0] == op and dtype == x.dtype and shape == x.shape:
            return plan
    return None


#: (op, elements): past the eager limit; cross_replica_sum and reduce_scatter also past
#: PAIR_ALLREDUCE_MAX_BYTES (the reduce-scatter then all-gather), unevenly split
_CALLS = [(op, _N) for op in sorted(_OPS)] + [
    ("cross_replica_sum", _exchange.PAIR_ALLREDUCE_MAX_BYTES // 4 + 3),
    ("cross_replica_min", _exchange.PAIR_ALLREDUCE_MAX_BYTES // 4 + 3),
    ("reduce_scatter", 300_001)]


@pytest.mark.parametrize("op, n", _CALLS)
def test_a_prepared_large_call_gives_the_bytes_and_counts_of_the_general_path(strategy, op,
                                                                               n):
    engine = get_engine()
    if engine.num_local_replicas != 1:
        return  # (no one-replica path on this layout)
    call, general = _OPS[op]
    rank = popdist.getInstanceIndex()
    if op == "all_to_all":  # (its input splits into one block per replica: _N is
        n -= n % engine.num_replicas  # divisible by 2-4, 6, 8, 12 and 16, not by 5)
    x = (np.sin(np.arange(n, dtype=np.float32) * (rank + 1)) * 3.7 + 0.25).astype(np.float32)
    strategy.run(lambda: call(x))  # the signature's plan
    plan = _plan(_KEYS.get(op, op), x)
    assert plan is not None and not plan.eager and plan._move is not None, op
    recorder = engine.recorder

    def sent_by(fn):
        before = recorder.bytes_sent()
        result = fn()
        return result, recorder.bytes_sent() - before

    totals = engine.ledger.totals().get(_KEYS.get(op, op))
    calls, transported = (totals.calls, totals.transport_bytes) if totals else (0, 0)
    ours, ours_sent = strategy.run(lambda: sent_by(lambda: call(x)))[0]
    desc = plan.desc.with_seq(10**6)
    theirs, theirs_sent = sent_by(lambda: general(engine, desc, x, consecutive(None))[0])
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, op
    assert ours.tobytes() == theirs.tobytes(), op
    assert ours_sent == theirs_sent > 0 or (op == "broadcast" and rank != 0
                                            and ours_sent == theirs_sent == 0), \
        (op, ours_sent, theirs_sent)
    # the call's entry in the ledger: one more call of its op, with the bytes it sent
    after = engine.ledger.totals()[_KEYS.get(op, op)]
    assert (after.calls - calls, after.transport_bytes - transported) == (1, ours_sent), op


def test_a_prepared_call_names_its_number_in_its_wait(strategy):
    engine = get_engine()
    x = np.ones(_N, np.float32)
    if engine.num_local_replicas != 1 or (getattr(engine.transport, "posts_early", False)
                                          and x.nbytes * engine.num_replicas
                                          >= EARLY_MIN_BYTES):
        return  # (posted before its agreement: test_perrank_early.py)
    strategy.run(lambda: C.all_gather(x))
    plan = _plan("all_gather", x)
    seq = engine.rendezvous.seq[0]
    strategy.run(lambda: C.all_gather(x))
    text = str(plan._move._patience.what)
    assert text == plan.desc.with_seq(seq).label() == f"all_gather #{seq}", text
