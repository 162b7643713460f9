"""The common call of a one-replica instance (collectives._engine.plan.common and Plan):
a call found among the plans skips the argument checks its dtype and shape passed, so
these tests check that what the plan does not cover is still checked, that its calls are
recorded and charged like any other, and that forgotten plans are not used."""

import numpy as np
import pytest

import collectives as C
from collectives._engine import plan as _plan
from collectives._engine.runtime import get_engine
from ipu_node import clock


def test_other_arguments_after_a_common_call_are_still_checked(local_system):
    strategy = local_system(1)
    x = np.arange(6, dtype=np.float32)

    def step():
        C.cross_replica_sum(x)
        C.all_to_all(x, 0, 0)
        C.reduce_scatter(x, op="ADD")
        C.broadcast(x, 0)
        errors = []
        for call in (lambda: C.cross_replica_sum(x.astype(np.uint8)),      # dtype
                     lambda: C.cross_replica_reduce(x > 0, "ADD"),        # bool with ADD
                     lambda: C.all_to_all(x, True, 0),                     # bool dimension
                     lambda: C.all_to_all(x, 1, 0),                        # out of range
                     lambda: C.reduce_scatter(x.reshape(2, 3), op="ADD"),  # rank 2
                     lambda: C.reduce_scatter(x, op="NOPE"),               # operator
                     lambda: C.broadcast(x, 1)):                           # root
            with pytest.raises((TypeError, ValueError)) as info:
                call()
            errors.append(type(info.value).__name__)
        return errors

    assert strategy.run(step)[0] == ["CollectiveTypeError", "CollectiveTypeError"] + [
        "CollectiveArgumentError"] * 5


def test_common_calls_are_recorded_and_charged_like_the_first(local_system):
    strategy = local_system(1)
    x = np.ones(4, np.float32)
    C.reset_stats()
    clock.reset_timelines()
    results = strategy.run(lambda: [C.cross_replica_sum(x) for _ in range(5)])[0]
    assert (("cross_replica_sum",), x.dtype, x.shape) in _plan.common_plans  # (calls 2-5)
    assert all(r.tobytes() == x.tobytes() and r is not x for r in results)
    totals = C.stats()["cross_replica_sum"]
    assert totals.calls == 5 and totals.payload_bytes == 5 * x.nbytes
    events = [e for e in clock.timelines()[0].events() if e.kind == "collective"]
    assert len(events) == 5 and all(e.label == "cross_replica_sum" for e in events)
    assert [e.start_s for e in events] == [i * events[0].duration_s for i in range(5)]
    assert len(C.call_records()) == 5


def test_forgotten_plans_are_not_used(local_system):
    strategy = local_system(1)
    x = np.ones(3, np.float64)
    strategy.run(lambda: C.all_gather(x))
    engine = get_engine()
    (plan,) = engine._plans.values()
    engine.forget_plans()
    assert not plan.live
    got = strategy.run(lambda: C.all_gather(x))[0]
    assert got.tobytes() == x.tobytes()
    (again,) = engine._plans.values()
    assert again is not plan and again.live


def test_a_new_system_makes_new_plans(local_system):
    x = np.ones(2, np.int32)
    local_system(1).run(lambda: C.broadcast(x))
    first = get_engine()
    got = local_system(1).run(lambda: C.broadcast(x))[0]  # configured again
    assert got.tolist() == [1, 1]
    assert get_engine() is not first and len(get_engine()._plans) == 1
