"""loops.repeat / while_loop, ipu_compiler.compile and the placement scopes: calling
convention, return conventions, TF-IPU's errors and messages, the sharding tutorial
[002:189-230] and O7 (a sharded result equals the unsharded one)."""

from __future__ import annotations

import numpy as np
import pytest

import ipu_node
from ipu_node import Operation, current_replica_context, ipu_compiler, loops, scopes
from ipu_node.data import Dataset
from ipu_node.errors import NotPlacedOnIPUError
from ipu_node.ipu_infeed_queue import IPUInfeedQueue


# ipu_compiler.compile needs a configured system: a 1-IPU one unless a test makes another
pytestmark = pytest.mark.usefixtures("one_ipu_system")


def on_ipu(fn, inputs=None):
    with scopes.ipu_scope("/device:IPU:0"):
        return ipu_compiler.compile(fn, inputs)


# ----- loops -------------------------------------------------------------------------------

def test_return_conventions():
    assert loops.repeat(3, lambda v: v + 1, [np.float32(0)]) == 3  # one value: bare
    a, b = loops.repeat(4, lambda a, b: (b, a + b), [np.int32(0), np.int32(1)])  # a list
    assert (int(a), int(b)) == (3, 5)
    calls = []
    op = loops.repeat(2, lambda: calls.append(1))  # no carried values: an Operation
    assert isinstance(op, Operation) and calls == [1, 1]
    assert loops.repeat(0, lambda v: v + 1, 7) == 7


def test_python_scalars_are_typed_as_tf_types_them():
    out = loops.repeat(2, lambda v: v + np.float32(0.5), [0.0])
    assert out.dtype == np.float32 and out == 1.0
    assert loops.repeat(2, lambda i: i + np.int32(1), 0).dtype == np.int32


def test_infeed_calling_convention_tuple_dict_and_nested():
    """IOT: a (dict, y) element passes the dict as one argument; a (dict,) element is
    unpacked into keyword arguments."""
    x = {"x0": np.ones([2], np.float32), "x1": np.ones([2], np.float32)}
    y = np.ones([2], np.float32)
    nested = IPUInfeedQueue(Dataset.from_tensor_slices((x, y)))
    assert nested.number_of_tuple_elements == 2
    assert loops.repeat(2, lambda t, x, y: t + x["x0"] + x["x1"] + y, [0.0], nested) == 6.0
    only_dict = IPUInfeedQueue(Dataset.from_tensor_slices((x,)))
    assert only_dict.number_of_tuple_elements == 2
    assert loops.repeat(2, lambda t, x0, x1: t + x0 + x1, [0.0], only_dict) == 4.0
    plain = IPUInfeedQueue(Dataset.from_tensor_slices(
        {"features": np.arange(6.0, dtype=np.float32).reshape(3, 2),
         "labels": np.arange(3, dtype=np.int32)}))

    def body(loss, features, labels):  # the seed's skeleton [004:177]
        return loss + features.sum() + labels.astype(np.float32)

    assert loops.repeat(3, body, [np.float32(0)], plain) == 18.0
    assert plain.dequeued


def test_arity_errors_have_tf_messages():
    with pytest.raises(TypeError, match=r"^Supplied loop body function cannot be called with "
                       r"the specified inputs. You specified 1 inputs: .*, but the loop body "
                       r"needs exactly 2 arguments.$"):
        loops.repeat(1, lambda a, b: (a, b), [0.0])
    infeed = IPUInfeedQueue(Dataset.range(3))
    with pytest.raises(TypeError, match=r"You specified 1 inputs: .* and 1 additional inputs "
                       r"from infeed, but the computation needs exactly 1 argument.$"):
        loops.repeat(1, lambda v: v, [0.0], infeed)
    with pytest.raises(TypeError, match="^Supplied loop condition function cannot be called"):
        loops.while_loop(lambda a, b: True, lambda v: v, [0.0])
    with pytest.raises(TypeError, match="needs at least 2 arguments"):
        loops.repeat(1, lambda a, b, c=1: (a, b), [0.0])


def test_dtype_mismatch_and_bad_return():
    with pytest.raises(TypeError, match=r"^Mismatch between input types and output types for "
                       r"loop body: \['float32'\] vs \['float64'\].$"):
        loops.repeat(1, lambda v: np.float64(v), [np.float32(0)])
    with pytest.raises(ValueError, match="^IPU loop body must return zero or more Tensor "
                       "values followed by zero or more Operations.$"):
        loops.repeat(1, lambda v: (Operation("x"), v), [np.float32(0)])
    with pytest.raises(ValueError, match="integer n >= 0"):
        loops.repeat(-1, lambda v: v, [0.0])


def test_while_loop_condition_and_maximum_iterations():
    assert loops.while_loop(lambda v: v < 10, lambda v: v * 2, [np.int32(1)]) == 16
    assert loops.while_loop(lambda v: True, lambda v: v + 1, [np.int32(0)],
                            maximum_iterations=5) == 5


def test_current_loop_tells_the_iteration_count():
    assert loops.current_loop() is None
    seen = []

    def inner():
        info = loops.current_loop()
        seen.append((info.kind, info.iterations, info.iteration))

    def outer():
        seen.append(("outer", loops.current_loop().iterations))
        loops.while_loop(lambda: True, inner, maximum_iterations=2)

    loops.repeat(2, outer)
    assert seen == [("outer", 2), ("while_loop", 2, 0), ("while_loop", 2, 1),
                    ("outer", 2), ("while_loop", 2, 0), ("while_loop", 2, 1)]
    on_ipu(lambda: seen.append(loops.current_loop()))  # compile is not a loop
    assert seen[-1] is None and loops.current_loop() is None


# ----- compile -----------------------------------------------------------------------------

def test_compile_return_conventions():
    assert on_ipu(lambda a, b: a + b, [np.float32(1), np.float32(2)]) == [3.0]
    assert on_ipu(lambda: (np.float32(1), np.float32(2), Operation("op"))) == [1.0, 2.0]
    assert on_ipu(lambda: None) is None
    assert on_ipu(lambda: Operation("only")) is None
    assert on_ipu(lambda: [Operation("a"), Operation("b")]) is None
    with pytest.raises(ValueError, match="Tensor values followed by zero or more Operations"):
        on_ipu(lambda: (Operation("a"), np.float32(1)))


def test_compile_outside_ipu_scope_raises():
    with pytest.raises(NotPlacedOnIPUError, match="not placed on an IPU device"):
        ipu_compiler.compile(lambda: np.float32(1))
    with scopes.ipu_scope("/device:IPU:1"), pytest.raises(ValueError, match="/device:IPU:0"):
        ipu_compiler.compile(lambda: np.float32(1))
    with pytest.raises(ValueError, match="not an IPU device name"):
        with scopes.ipu_scope("/device:CPU:0"):
            pass


def test_compile_without_strategy_is_one_replica():
    ctxs = []
    on_ipu(lambda: ctxs.append(current_replica_context()))
    assert (ctxs[0].replica_index, ctxs[0].num_replicas, ctxs[0].num_local_replicas) == (0, 1, 1)
    assert current_replica_context() is None


def test_compile_in_a_strategy_runs_every_local_replica_and_returns_replica_0s(local_system):
    strategy = local_system(4)
    ran = []

    def computation(x):
        r = current_replica_context().replica_index
        ran.append(r)
        return x + r, Operation("noop")

    with strategy.scope():  # no ipu_scope needed: the strategy's replicas are on IPU:0
        out = ipu_compiler.compile(computation, [np.float32(10)])
    assert out == [10.0] and sorted(ran) == [0, 1, 2, 3]
    with pytest.raises(NotPlacedOnIPUError):  # the runner is gone after the scope
        ipu_compiler.compile(computation, [np.float32(10)])
    inside = strategy.run(lambda: ipu_compiler.compile(lambda: current_replica_context()))
    assert [c[0].replica_index for c in inside] == [0, 1, 2, 3]  # in a replica: that replica


# ----- scopes ------------------------------------------------------------------------------

def _sharded_graph(pa, pb, pc):  # [002:196-205]
    with scopes.ipu_shard(0):
        o1 = pa + pb
    with scopes.ipu_shard(1):
        o2 = pa + pc
    with scopes.ipu_shard(2):
        o3 = pb + pc
    with scopes.ipu_shard(3):
        out = o1 + o2 + o3
        return out


def test_sharding_tutorial_gives_4_14():
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 4
    cfg.configure_ipu_system()
    try:
        args = [np.array(v, np.float32) for v in ([1., 1.], [0., 1.], [1., 5.])]
        result = on_ipu(_sharded_graph, args)
        assert len(result) == 1 and result[0].dtype == np.float32
        np.testing.assert_array_equal(result[0], [4., 14.])
        np.testing.assert_array_equal(result[0], (args[0] + args[1]) + (args[0] + args[2])
                                      + (args[1] + args[2]))  # O7: unsharded, same result
        shards = []

        def where():
            with scopes.ipu_shard(2):
                shards.append((scopes.current_shard(), scopes.current_ipu()))
            shards.append((scopes.current_shard(), scopes.current_ipu()))

        on_ipu(where)
        ipus = ipu_node.get_system().devices[0].ipus
        assert shards == [(2, ipus[2]), (None, ipus[0])]
    finally:
        ipu_node.reset_ipu_configuration()


def test_shard_index_is_checked_against_ipus_per_replica(local_system):
    strategy = local_system(2)  # two replicas of one IPU each

    def computation():
        with scopes.ipu_shard(1):
            return np.float32(0)

    with strategy.scope(), pytest.raises(ValueError, match=r"ipu_shard\(1\): replica \d has 1 "
                                         r"IPU\(s\) \(ipus_per_replica=1\), so shards are 0..0"):
        ipu_compiler.compile(computation)
    with pytest.raises(TypeError, match="integer"):
        with scopes.ipu_shard("1"):
            pass


def test_scopes_are_carried_into_replica_threads(local_system):
    strategy = local_system(2)
    seen = []
    with strategy.scope(), scopes.ipu_scope("/device:IPU:0"), scopes.ipu_shard(0):
        ipu_compiler.compile(lambda: seen.append((scopes.current_ipu_scope(),
                                                  scopes.current_shard())))
    assert seen == [("/device:IPU:0", 0)] * 2
    assert scopes.current_ipu_scope() is None and scopes.current_shard() is None
