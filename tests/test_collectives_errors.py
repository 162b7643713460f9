"""Mismatches, divergence and stalls on one instance of 4 replicas: errors on every replica,
never a hang. Each test has its own IPU system (a divergence makes the collectives of its
system unusable, by design)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import collectives as C
from collectives.options import STALL_WARNING_ENV, TIMEOUT_ENV
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig, reset_ipu_configuration

R = 4


@pytest.fixture
def strategy(monkeypatch):
    monkeypatch.setenv(STALL_WARNING_ENV, "0.3")
    monkeypatch.setenv(TIMEOUT_ENV, "1.5")
    cfg = IPUConfig()
    cfg.auto_select_ipus = R
    cfg.configure_ipu_system()
    yield IPUMultiReplicaStrategy()
    reset_ipu_configuration()


def run_each(strategy, fn):
    """Run ``fn(replica)`` on every replica; return what each returned or raised."""
    def step():
        try:
            return fn(int(C.replication_index()))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            return exc

    start = time.monotonic()
    out = strategy.run(step)
    return out, time.monotonic() - start


def test_shape_mismatch_raises_on_every_replica_naming_op_replicas_and_difference(strategy):
    out, took = run_each(strategy, lambda r: C.cross_replica_sum(np.ones(3 if r == 2 else 4),
                                                                 name="grads"))
    assert took < 10
    for exc in out:
        assert isinstance(exc, C.CollectiveMismatchError), exc
        message = str(exc)
        assert "cross_replica_sum" in message and "'grads'" in message
        assert "replica 2" in message and "shape (4,) vs (3,)" in message


@pytest.mark.parametrize("other, diff", [
    (lambda x: C.all_gather(x), "op 'cross_replica_sum' vs 'all_gather'"),
    (lambda x: C.cross_replica_sum(x.astype(np.float32)), "dtype 'float64' vs 'float32'"),
    (lambda x: C.cross_replica_sum(x, 2), "group 'ALL(0)' vs 'CONSECUTIVE(2)'"),
    (lambda x: C.cross_replica_reduce(x, "MAX"), "operator"),
])
def test_any_difference_is_a_mismatch(strategy, other, diff):
    out, _ = run_each(strategy, lambda r: other(np.ones(2)) if r == 3
                      else C.cross_replica_sum(np.ones(2)))
    assert all(isinstance(e, C.CollectiveMismatchError) and diff in str(e) for e in out), out


def test_root_and_dimensions_are_compared(strategy):
    out, _ = run_each(strategy, lambda r: C.broadcast(np.ones(2), r % 2))
    assert all(isinstance(e, C.CollectiveMismatchError) and "params" in str(e) for e in out)


def test_a_replica_that_skips_a_collective_is_named(strategy):
    def fn(r):
        C.cross_replica_sum(np.ones(2))
        if r != 1:
            C.cross_replica_sum(np.ones(2))
        return "done"

    out, took = run_each(strategy, fn)
    assert took < 1.0  # detected when replica 1 returns, not at the timeout
    assert out[1] == "done"
    for r in (0, 2, 3):
        assert isinstance(out[r], C.CollectiveMismatchError), out[r]
        assert "divergent control flow" in str(out[r]) and "replica 1 (after 1 collectives)" \
            in str(out[r])
    with pytest.raises(C.CollectiveAbortedError):
        strategy.run(lambda: C.cross_replica_sum(np.ones(2)))


@pytest.mark.slow
def test_a_late_replica_gets_a_stall_warning_then_a_timeout(strategy, caplog):
    def fn(r):
        if r == 0:
            time.sleep(3.0)  # never arrives in time (timeout 1.5 s)
            return "late"
        return C.cross_replica_sum(np.ones(2))

    with caplog.at_level(logging.WARNING, logger="collectives"):
        out, took = run_each(strategy, fn)
    assert out[0] == "late" and took < 5
    for r in (1, 2, 3):
        # the replicas either time out or see replica 0 leave: both name replica 0
        assert isinstance(out[r], (C.CollectiveTimeoutError, C.CollectiveMismatchError))
    assert any(isinstance(out[r], C.CollectiveTimeoutError) for r in (1, 2, 3))
    assert "replicas [0]" in str(next(e for e in out if isinstance(e, C.CollectiveTimeoutError)))
    warnings = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert warnings and "replicas [0]" in warnings[0]


def test_a_failing_replica_releases_the_others(strategy):
    def fn():
        if C.replication_index() == 2:
            raise KeyError("boom")
        return C.cross_replica_sum(np.ones(2))

    start = time.monotonic()
    with pytest.raises(KeyError):
        strategy.run(fn)
    assert time.monotonic() - start < 30   # released, not left to the 300 s collective timeout


def test_stats_count_calls_bytes_and_methods(strategy):
    C.reset_stats()
    strategy.run(lambda: (C.cross_replica_sum(np.ones(1000, np.float32)),
                          C.all_gather(np.ones(4, np.float32))))
    stats = C.stats()
    assert stats["cross_replica_sum"].calls == 1
    assert stats["cross_replica_sum"].payload_bytes == 4000
    assert stats["cross_replica_sum"].wall_s > 0
    assert stats["cross_replica_sum"].modelled_s > 0  # the POD16 hardware model, by default
    # "auto": the cost model prices the cheapest schedule (HardwareCostModel.choose names it)
    assert stats["cross_replica_sum"].methods == {"auto": 1}
    assert stats["all_gather"].methods == {"auto": 1}
    record = C.call_records()[-1]
    assert record.groups == ((0, 1, 2, 3),) and record.transport_bytes == 0


def test_cost_model_hook_fills_modelled_seconds(strategy):
    seen = []
    C.set_cost_model(lambda record: seen.append(record) or 1e-6 * record.nbytes)
    try:
        C.reset_stats()
        strategy.run(lambda: C.cross_replica_sum(np.ones(10)))
    finally:
        C.set_cost_model(None)
    assert C.stats()["cross_replica_sum"].modelled_s == pytest.approx(80e-6)
    assert seen[0].op == "cross_replica_sum" and seen[0].ipus_per_replica == 1


def test_gcl_options_choose_the_method_never_the_result(monkeypatch):
    results = {}
    for method in ("clockwise_ring", "quad_directional_ring", "broadcast"):
        monkeypatch.setenv("GCL_OPTIONS", f'{{"method": "{method}"}}')
        cfg = IPUConfig()
        cfg.auto_select_ipus = R
        cfg.gcl_poplar_options = {"syncful.maxBroadcastSize": "0"}
        cfg.configure_ipu_system()
        strategy = IPUMultiReplicaStrategy()
        x = [np.random.default_rng(r).standard_normal(100) for r in range(R)]
        out = strategy.run(lambda: C.cross_replica_sum(x[C.replication_index()]))
        results[method] = out[0].tobytes()
        assert C.call_records()[-1].method == method
    reset_ipu_configuration()
    assert len(set(results.values())) == 1


def test_unknown_gcl_option_is_an_error_naming_the_known_ones():
    cfg = IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.gcl_poplar_options = {"maxBytesPerTile": "100"}
    cfg.configure_ipu_system()
    try:
        with pytest.raises(ValueError, match="maxBytesPerTile.*known: method, "
                                             "syncful.maxBroadcastSize"):
            IPUMultiReplicaStrategy()
    finally:
        reset_ipu_configuration()
