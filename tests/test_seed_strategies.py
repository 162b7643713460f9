"""The seeds' multi-worker pipeline structure (E11/E12, seed 004:1991-2187) in one process,
strategies made before the IPU system, the replication factor derived from a pipeline's
shards, strategy.reduce of a plain per-worker value, and Variable arithmetic."""

import importlib.util
import warnings

import numpy as np
import pytest

import ipu_node
from collectives.strategies import IPUStrategy, ReduceOp
from ipu_node.optimizers import GradientDescentOptimizer, MapGradientOptimizer
from ipu_node.runtime import occupancy
from tests.procs import PROGRAMS


@pytest.fixture(autouse=True)
def _reset():
    ipu_node.reset_ipu_configuration()
    yield
    ipu_node.reset_ipu_configuration()


def _seed_pipeline():
    spec = importlib.util.spec_from_file_location("seed_pipeline", PROGRAMS / "seed_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_seeds_pipeline_structure_runs_under_ipu_strategy():
    program = _seed_pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = program.main("ipu")
    expected = program.oracle(workers=1)
    # auto_select_ipus(config, num_ipus=2) and two stages: one replica of two IPUs
    assert (got["replicas"], got["ipus_per_replica"]) == (1, 2)
    system = ipu_node.get_system()
    assert got["stage_ipus"] == [ipu.id for ipu in system.devices[0].ipus]  # W1, W2 per stage
    np.testing.assert_array_equal(got["W1"], expected["W1"])
    np.testing.assert_array_equal(got["W2"], expected["W2"])
    np.testing.assert_array_equal(got["losses"], expected["losses"])


def test_a_strategy_made_first_waits_for_the_system_and_compiling_before_it_is_an_error():
    from ipu_node import ipu_compiler, scopes
    strategy = IPUStrategy()
    with strategy.scope():
        with pytest.raises(ipu_node.NotConfiguredError, match="configure_ipu_system"):
            strategy.run(lambda: 1)
        with pytest.raises(ipu_node.NotConfiguredError, match="configure_ipu_system"):
            ipu_compiler.compile(lambda: np.ones(2))
    with scopes.ipu_scope("/device:IPU:0"):
        with pytest.raises(ipu_node.NotConfiguredError, match="ipu_compiler.compile: no IPU "
                                                              "system is configured"):
            ipu_compiler.compile(lambda: np.ones(2))
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    assert strategy.run(lambda: 1) == [1, 1]
    assert strategy.num_replicas_in_sync == 2


def test_reduce_of_a_plain_per_worker_value():
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    strategy = IPUStrategy()
    assert strategy.reduce(ReduceOp.SUM, np.float32(1.5)) == np.float32(1.5)  # one worker
    assert strategy.reduce("MEAN", 3.0) == 3.0
    out = strategy.reduce(ReduceOp.SUM, {"a": np.arange(3.0)})
    np.testing.assert_array_equal(out["a"], np.arange(3.0))
    assert strategy.reduce(ReduceOp.SUM, [1.0, 2.0]) == 3.0                    # per replica


def _two_stage_pipeline(W1, W2, device_mapping=None):
    from ipu_node.pipelining_ops import OptimizerFunctionOutput, Stage, pipeline

    def forward1(x):
        return (x @ W1,), x

    def backward1(x, grads):
        return {W1: x.T @ grads[0]}, None

    def forward2(h):
        return (float((h @ W2).sum()),), h

    def backward2(h, grads):
        return {W2: h.T @ np.ones((len(h), 1))}, (np.ones((len(h), 1)) @ W2.T,)

    class Feed:
        def next_element(self):
            return np.ones((2, 3))

    opt = GradientDescentOptimizer(0.1)
    pipeline([Stage(forward1, backward1), Stage(forward2, backward2)],
             gradient_accumulation_count=4, infeed_queue=Feed(),
             optimizer_function=lambda loss: OptimizerFunctionOutput(opt, loss),
             device_mapping=device_mapping, outfeed_queue=_Drop())


class _Drop:
    outfeed_mode = None

    def enqueue(self, value):
        pass


def test_a_derived_layout_widens_once_and_keeps_the_device_ipus():
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 4
    system = cfg.configure_ipu_system()
    held = sorted(h.ipu_id for h in occupancy.Occupancy(system.model.name).holders(False)
                  if h.pid == __import__("os").getpid())
    strategy = IPUStrategy()
    with strategy.scope():
        W1 = strategy.Variable(np.full((3, 2), 0.5), name="W1")
        W2 = strategy.Variable(np.full((2, 1), 0.25), name="W2")
        strategy.run(lambda: _two_stage_pipeline(W1, W2))
    widened = ipu_node.get_system()
    assert (widened.num_local_replicas, widened.ipus_per_replica) == (2, 2)
    assert sorted(i.id for i in widened.devices[0].ipus) == sorted(
        i.id for i in system.devices[0].ipus)
    assert sorted(h.ipu_id for h in occupancy.Occupancy(system.model.name).holders(False)
                  if h.pid == __import__("os").getpid()) == held
    # every replica's copy took the same two summed updates (sum over 2 replicas)
    g2 = 2 * 4 * np.full((2, 1), 2 * (3 * 0.5))      # replicas x micro-batches x h.T @ 1
    np.testing.assert_allclose(W2.numpy(), 0.25 - 0.1 * g2)
    assert widened.layout_bound_by == "a pipeline of 2 shards"


def test_a_bound_layout_names_what_to_set():
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.ipus_per_replica = 1
    cfg.configure_ipu_system()
    strategy = IPUStrategy()
    with strategy.scope():
        W1 = strategy.Variable(np.ones((3, 2)), name="W1")
        W2 = strategy.Variable(np.ones((2, 1)), name="W2")
        with pytest.raises(ValueError, match=r"the pipeline needs 2 IPUs per replica .* but "
                                             r"each replica has 1 .*set IPUConfig."
                                             r"ipus_per_replica = 2"):
            strategy.run(lambda: _two_stage_pipeline(W1, W2))
        with pytest.raises(ValueError, match=r"device_mapping\[0\] \(stage 0\) is 3, not an "
                                             r"IPU of the replica"):
            strategy.run(lambda: _two_stage_pipeline(W1, W2, device_mapping=[3, 0]))


def test_a_run_without_pipeline_binds_the_derived_layout():
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 2
    system = cfg.configure_ipu_system()
    assert system.replication_derived and system.layout_bound_by is None
    strategy = IPUStrategy()
    strategy.run(lambda: 0)
    assert system.layout_bound_by == "a replica function ran on it"
    with strategy.scope():
        W1 = strategy.Variable(np.ones((3, 2)), name="W1")
        W2 = strategy.Variable(np.ones((2, 1)), name="W2")
        with pytest.raises(ValueError, match="bound by a replica function ran on it"):
            strategy.run(lambda: _two_stage_pipeline(W1, W2))


def test_variables_take_part_in_arithmetic_as_tf_variables_do():
    v = ipu_node.Variable(np.array([1.0, 2.0]), "v")
    wd = 0.5
    decay = lambda g, var: g + wd * var          # the seeds' MapGradientOptimizer decay
    np.testing.assert_array_equal(decay(np.ones(2), v), [1.5, 2.0])
    assert isinstance(v + 1, np.ndarray) and float(v[1]) == 2.0 and len(v) == 2
    np.testing.assert_array_equal(np.ones(2) - v, [0.0, -1.0])
    assert (v @ np.ones(2)) == 3.0 and np.sum(v) == 3.0 and (-v)[0] == -1.0
    assert (v > 1).tolist() == [False, True] and v == v and (v == v.value) is False
    assert float(ipu_node.Variable(4.0) ** 0.5) == 2.0
    opt = MapGradientOptimizer(GradientDescentOptimizer(1.0), decay)
    opt.apply_gradients([(np.ones(2), v)])
    np.testing.assert_array_equal(v.value, [1.0 - 1.5, 2.0 - 2.0])
    v.assign_sub(np.ones(2))
    np.testing.assert_array_equal(v.read_value(), [-1.5, -1.0])
