"""ipu_node.Variable, ipu_node.optimizers and collectives.optimizers against numpy oracles;
one conformance test runs over every optimizer."""

import numpy as np
import pytest

import collectives
import ipu_node
from collectives import cross_replica_mean, replication_index
from collectives.optimizers import (CrossReplicaGradientAccumulationOptimizerV2,
                                    CrossReplicaOptimizer)
from ipu_node import Variable
from ipu_node.errors import FailedPreconditionError
from ipu_node.execution import optimizers as opt_mod
from ipu_node.optimizers import (GradientAccumulationOptimizerV2, GradientDescentOptimizer,
                                 MapGradientOptimizer, MomentumOptimizer, Optimizer)
from tests.hw_fixtures import isolated  # noqa: F401
from tests.pipeline_models import configure, in_replica

RNG = np.random.default_rng(7)
W0 = RNG.standard_normal((3, 4)).astype(np.float32)
B0 = RNG.standard_normal(4).astype(np.float32)
GRADS = [(RNG.standard_normal((3, 4)).astype(np.float32),
          RNG.standard_normal(4).astype(np.float32)) for _ in range(6)]


@pytest.fixture
def in_loop(monkeypatch):
    """Pretend to run inside ``loops.repeat(n)`` (the loop's iteration count)."""
    def enter(n):
        monkeypatch.setattr(opt_mod, "_current_loop_iterations", lambda: n)
    return enter


def _apply_all(opt, steps=GRADS):
    w, b = Variable(W0, "w"), Variable(B0, "b")
    for gw, gb in steps:
        opt.apply_gradients([(gw, w), (gb, b)])
    return w.value, b.value


# -- Variable ---------------------------------------------------------------------------


def test_variable_is_accounted_on_the_replica_ipu_and_freed(isolated):
    system = configure(ipus_per_replica=2)
    ipus = [ipu.id for ipu in system.devices[0].ipus]

    def body():
        v = Variable(np.zeros((256, 256), np.float32), "big", shard=1)
        u = Variable(np.zeros(10, np.float64))
        used = ipu_node.memory_usage()
        assert used[ipus[1]].in_use_bytes == 256 * 256 * 4
        assert used[ipus[0]].in_use_bytes == 80
        assert (v.ipu_id, u.ipu_id, v.name, u.name) == (ipus[1], ipus[0], "big", "Variable")
        assert {v: 1, u: 2}[v] == 1 and v != u and v == v
    in_replica(body)
    assert all(m.in_use_bytes == 0 for m in ipu_node.memory_usage().values())


def test_variable_assign_checks_shape_and_dtype():
    v = Variable(np.zeros((2, 3), np.float32), "v")
    assert v.ipu_id is None  # host code: not on an IPU
    v.assign(np.ones((2, 3), np.float32))
    v.assign(np.ones((2, 3), np.float16))  # safe cast
    assert v.dtype == np.float32 and v.value.sum() == 6
    with pytest.raises(ValueError, match=r"'v': cannot assign a value of shape \(3, 2\)"):
        v.assign(np.ones((3, 2), np.float32))
    with pytest.raises(TypeError, match="dtype float64 to a Variable of dtype float32"):
        v.assign(np.ones((2, 3), np.float64))
    source = np.ones(3)
    w = Variable(source)
    source[0] = 5
    assert w.value[0] == 1  # a copy


# -- plain optimizers -------------------------------------------------------------------


def test_gradient_descent_oracle():
    w, b = _apply_all(GradientDescentOptimizer(0.1))
    ew, eb = W0.copy(), B0.copy()
    for gw, gb in GRADS:
        ew, eb = ew - np.float32(0.1) * gw, eb - np.float32(0.1) * gb
    assert w.tobytes() == ew.tobytes() and b.tobytes() == eb.tobytes()


def test_momentum_oracle_tf1_rule():
    opt = MomentumOptimizer(0.1, 0.9)
    w, b = _apply_all(opt)
    ew, acc = W0.copy(), np.zeros_like(W0)
    for gw, _ in GRADS:
        acc = np.float32(0.9) * acc + gw
        ew = ew - np.float32(0.1) * acc
    assert w.tobytes() == ew.tobytes()
    assert opt.get_slot_names() == ["momentum"]
    assert len(opt.variables()) == 2 and opt.get_slot(Variable(W0), "momentum") is None


def _accumulated_sgd_oracle():
    """W after SGD(0.1) on the sums of GRADS[:3] and GRADS[3:] (from zeros, in order)."""
    ew = W0.copy()
    for chunk in (GRADS[:3], GRADS[3:]):
        acc = np.zeros_like(W0)
        for gw, _ in chunk:
            acc = acc + gw
        ew = ew - np.float32(0.1) * acc
    return ew


def test_gradient_accumulation_v2_sums_and_applies_every_n(in_loop):
    in_loop(6)
    opt = GradientAccumulationOptimizerV2(GradientDescentOptimizer(0.1), 3)
    w, _ = _apply_all(opt)
    ew = _accumulated_sgd_oracle()
    assert w.tobytes() == ew.tobytes()


def test_gradient_accumulation_v2_errors(in_loop):
    with pytest.raises(ValueError, match=r"^num_mini_batches must be a positive number\.$"):
        GradientAccumulationOptimizerV2(GradientDescentOptimizer(0.1), 0)
    opt = GradientAccumulationOptimizerV2(GradientDescentOptimizer(0.1), 4)
    in_loop(None)
    with pytest.raises(FailedPreconditionError, match="which is not inside a training loop"):
        _apply_all(opt)
    in_loop(6)
    with pytest.raises(FailedPreconditionError, match=(
            "Detected a gradient accumulation operation with 4 number of mini batches inside "
            "a loop with 6 iterations. It is required that the number of mini batches to "
            "accumulate evenly divides the number of loop iterations.")):
        _apply_all(opt)


def test_map_gradient_optimizer():
    opt = MapGradientOptimizer(GradientDescentOptimizer(1.0), lambda g, v: g * 2 + v.value)
    w = Variable(W0)
    opt.apply_gradients([(GRADS[0][0], w)])
    assert w.value.tobytes() == (W0 - (GRADS[0][0] * 2 + W0)).tobytes()


def _all_optimizers():
    sgd = GradientDescentOptimizer(0.1)
    return [sgd, MomentumOptimizer(0.1, 0.5), GradientAccumulationOptimizerV2(sgd, 2),
            MapGradientOptimizer(sgd, lambda g, v: g), CrossReplicaOptimizer(sgd),
            CrossReplicaGradientAccumulationOptimizerV2(sgd, 2)]


@pytest.mark.parametrize("index", range(6))
def test_conformance_every_optimizer(isolated, in_loop, index):
    """Same interface, same behaviour on one replica for a pair of steps: the Variables
    move, stay float32 and keep their shapes; None gradients are skipped; bad pairs are
    refused with the optimizer's name."""
    configure(ipus_per_replica=1)
    in_loop(2)

    def body():
        opt = _all_optimizers()[index]
        assert isinstance(opt, Optimizer)
        w, b, untouched = Variable(W0), Variable(B0), Variable(B0)
        for gw, gb in GRADS[:2]:
            opt.apply_gradients([(gw, w), (gb, b), (None, untouched)])
        assert w.dtype == np.float32 and w.shape == (3, 4) and not np.array_equal(w.value, W0)
        assert untouched.value.tobytes() == B0.tobytes()
        assert all(isinstance(v, Variable) for v in opt.variables())
        assert isinstance(opt.get_slot_names(), list)
        with pytest.raises(TypeError, match="must be a"):
            opt.apply_gradients([(GRADS[0][0], W0)])
        with pytest.raises(ValueError, match="has shape"):
            opt.apply_gradients([(GRADS[0][1], w)])
    in_replica(body)


# -- cross-replica ----------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_cross_replica_optimizer_is_the_per_tensor_mean_bit_for_bit(isolated, replicas):
    configure(ipus_per_replica=1, replicas=replicas)
    from collectives.strategies import IPUMultiReplicaStrategy
    strategy = IPUMultiReplicaStrategy()
    collectives.reset_stats()

    def grads():
        r = int(replication_index())
        rng = np.random.default_rng(r)
        return (rng.standard_normal((3, 4)).astype(np.float32),
                rng.standard_normal(4).astype(np.float32),
                rng.standard_normal(5))  # a float64 gradient travels in its own buffer

    def fused():
        vs = [Variable(W0), Variable(B0), Variable(np.zeros(5))]
        CrossReplicaOptimizer(GradientDescentOptimizer(1.0)).apply_gradients(
            list(zip(grads(), vs)))
        return [v.value for v in vs]

    def per_tensor():
        means = [cross_replica_mean(g) for g in grads()]
        return [W0 - np.float32(1.0) * means[0], B0 - np.float32(1.0) * means[1],
                np.zeros(5) - 1.0 * means[2]]
    got = strategy.run(fused)
    calls = collectives.stats()["cross_replica_mean"].calls
    assert calls == 2  # one exchange per dtype (float32, float64)
    expected = strategy.run(per_tensor)
    for g, e in zip(got, expected):
        for a, b in zip(g, e):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_cross_replica_accumulation_exchanges_once_per_n(isolated, in_loop):
    configure(ipus_per_replica=1, replicas=2)
    from collectives.strategies import IPUMultiReplicaStrategy
    strategy = IPUMultiReplicaStrategy()
    collectives.reset_stats()
    in_loop(6)

    def body():
        r = int(replication_index())
        opt = CrossReplicaGradientAccumulationOptimizerV2(GradientDescentOptimizer(0.1), 3)
        w = Variable(W0)
        for gw, _ in GRADS:
            opt.apply_gradients([(gw * (r + 1), w)])
        return w.value
    results = strategy.run(body)
    assert collectives.stats()["cross_replica_mean"].calls == 2
    ew = W0.copy()
    for chunk in (GRADS[:3], GRADS[3:]):
        acc0, acc1 = np.zeros_like(W0), np.zeros_like(W0)
        for gw, _ in chunk:
            acc0, acc1 = acc0 + gw, acc1 + gw * 2
        ew = ew - np.float32(0.1) * ((acc0 + acc1) / np.float32(2))
    for r in results:
        assert r.tobytes() == ew.tobytes()


def test_gradient_accumulation_v2_inside_loops_repeat(isolated):
    """The loop rule against the real ``loops.repeat`` (reference §1.8)."""
    from ipu_node import loops

    configure(ipus_per_replica=1)

    def body():
        w = Variable(W0)
        opt = GradientAccumulationOptimizerV2(GradientDescentOptimizer(0.1), 3)
        grads = iter(GRADS)

        def step():
            opt.apply_gradients([(next(grads)[0], w)])
        loops.repeat(6, step)
        with pytest.raises(FailedPreconditionError, match="inside a loop with 4 iterations"):
            loops.repeat(4, lambda: opt.apply_gradients([(GRADS[0][0], w)]))
        return w.value
    got = in_replica(body)
    ew = _accumulated_sgd_oracle()
    assert got.tobytes() == ew.tobytes()


def test_variable_follows_the_ipu_shard_scope(isolated):
    from ipu_node.scopes import ipu_shard

    system = configure(ipus_per_replica=2)

    def body():
        with ipu_shard(1):
            v = Variable(np.zeros(4))
        return v.ipu_id, v.shard
    assert in_replica(body) == (system.devices[0].ipus[1].id, 1)


def test_gradient_accumulation_v2_in_an_unbounded_while_loop(isolated):
    from ipu_node import loops

    configure(ipus_per_replica=1)

    def body():
        w = Variable(W0)
        opt = GradientAccumulationOptimizerV2(GradientDescentOptimizer(0.1), 2)

        def step(i):
            opt.apply_gradients([(GRADS[0][0], w)])
            return i + 1
        loops.while_loop(lambda i: i < 2, step, [0])
    with pytest.raises(FailedPreconditionError, match="unknown number of iterations"):
        in_replica(body)
