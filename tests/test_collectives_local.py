"""Collectives between the local replicas of one instance (threads, local transport)."""

import time

import numpy as np
import pytest

from collectives import (CollectiveAbortedError, CollectiveMismatchError, cross_replica_mean,
                         cross_replica_sum, replication_index)
from collectives.options import STALL_WARNING_ENV, TIMEOUT_ENV
from ipu_node import NotInReplicaError


def _tree_sum(rows):
    """The canonical tree order written out, as the oracle."""
    if len(rows) == 1:
        return rows[0]
    p = 1 << ((len(rows) - 1).bit_length() - 1)
    return _tree_sum(rows[:p]) + _tree_sum(rows[p:])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_sum_is_the_tree_sum_bit_for_bit(local_system, n):
    strategy = local_system(n)
    data = np.random.default_rng(n).standard_normal((n, 1001)).astype(np.float32)
    results = strategy.run(lambda: cross_replica_sum(data[int(replication_index())]))
    expected = _tree_sum(list(data))
    for r in results:
        assert r.dtype == np.float32 and r.tobytes() == expected.tobytes()
    # each replica owns its result: changing one leaves the others alone
    results[0][:] = 0
    assert all(r.tobytes() == expected.tobytes() for r in results[1:])


def test_groups_and_mean(local_system):
    strategy = local_system(4)

    def step():
        r = int(replication_index())
        return (cross_replica_sum(np.array([r, 10 * r], np.int64), replica_group_size=2),
                cross_replica_mean(np.float64(r)), replication_index())

    results = strategy.run(step)
    assert [s.tolist() for s, _, _ in results] == [[1, 10], [1, 10], [5, 50], [5, 50]]
    assert [float(m) for _, m, _ in results] == [1.5] * 4
    assert [int(i) for _, _, i in results] == [0, 1, 2, 3]


def test_input_is_never_modified(local_system):
    strategy = local_system(4)
    inputs = [np.full(5, float(i)) for i in range(4)]
    strategy.run(lambda: cross_replica_sum(inputs[int(replication_index())]))
    assert [a.tolist() for a in inputs] == [[float(i)] * 5 for i in range(4)]


def test_outside_a_replica_function_is_a_clear_error(local_system):
    local_system(2)
    with pytest.raises(NotInReplicaError, match="inside a replica function"):
        cross_replica_sum(np.ones(2))


def test_bad_dtype_and_group_size_are_clear_errors(local_system):
    strategy = local_system(4)
    with pytest.raises(TypeError, match="dtype complex128 is not supported"):
        strategy.run(lambda: cross_replica_sum(np.ones(2, complex)))
    strategy = local_system(4)
    with pytest.raises(ValueError, match="group size 3 does not divide"):
        strategy.run(lambda: cross_replica_sum(np.ones(2), replica_group_size=3))


def test_mismatched_shapes_raise_on_every_replica(local_system):
    strategy = local_system(4)
    errors = []

    def step():
        r = int(replication_index())
        try:
            cross_replica_sum(np.zeros(2 if r == 3 else 3, np.float32), name="grads")
        except CollectiveMismatchError as exc:
            errors.append(str(exc))
            raise

    started = time.monotonic()
    with pytest.raises(CollectiveMismatchError, match="shape"):
        strategy.run(step)
    assert time.monotonic() - started < 10
    assert len(errors) == 4
    assert "replica 3" in errors[0] and "float32[2]" in errors[0] and "'grads'" in errors[0]
    # the error was raised alike everywhere: the collectives remain usable
    assert strategy.run(lambda: cross_replica_sum(np.ones(1)))[0].tolist() == [4.0]


def test_a_failing_replica_releases_the_waiting_ones(local_system):
    strategy = local_system(4)
    seen = []

    def step():
        if int(replication_index()) == 2:
            raise KeyError("replica 2 failed")
        try:
            return cross_replica_sum(np.ones(3))
        except CollectiveAbortedError as exc:
            seen.append(exc)
            raise

    started = time.monotonic()
    with pytest.raises(KeyError, match="replica 2 failed"):
        strategy.run(step)
    assert time.monotonic() - started < 10
    assert len(seen) == 3


def test_a_replica_that_skips_a_collective_is_named(local_system, monkeypatch):
    monkeypatch.setenv(STALL_WARNING_ENV, "0.2")
    monkeypatch.setenv(TIMEOUT_ENV, "5")
    strategy = local_system(3)

    def step():
        if int(replication_index()) == 1:
            return None  # divergent control flow: this replica skips the collective
        return cross_replica_sum(np.ones(2))

    started = time.monotonic()
    with pytest.raises(CollectiveMismatchError, match=r"replica 1 .*returned from its function"):
        strategy.run(step)
    assert time.monotonic() - started < 4.5  # found as divergence, before the 5 s timeout


def test_strategy_broadcast_and_reduce(local_system):
    strategy = local_system(4)
    params = {"w": np.arange(6.0).reshape(2, 3), "b": np.float32(2)}
    out = strategy.broadcast(params)
    assert out["w"].tolist() == params["w"].tolist() and float(out["b"]) == 2.0
    results = strategy.run(lambda: np.float64(replication_index()))
    assert strategy.reduce("SUM", results) == 6.0
    assert strategy.reduce("MEAN", results) == 1.5
    with pytest.raises(ValueError, match="Unsupported reduce op"):
        strategy.reduce("MAX", results)
