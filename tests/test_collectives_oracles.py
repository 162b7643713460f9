"""Every op, operator, group type and dtype on one instance of 8 replicas (threads), against
the numpy oracles of ``tests.collective_cases``; the seeds' examples; argument errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

import collectives as C
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig, reset_ipu_configuration
from tests.collective_cases import DTYPES, all_cases, assert_same, oracle, run_case

R = 8
CONSECUTIVE, ORTHOGONAL = C.CommGroupType.CONSECUTIVE, C.CommGroupType.ORTHOGONAL


def make_strategy(replicas: int = R) -> IPUMultiReplicaStrategy:
    cfg = IPUConfig()
    cfg.auto_select_ipus = replicas
    cfg.configure_ipu_system()
    return IPUMultiReplicaStrategy()


@pytest.fixture(scope="module")
def strategy():
    yield make_strategy()
    reset_ipu_configuration()


@pytest.fixture(scope="module")
def results(strategy):
    cases = all_cases(R)

    def step():
        r = int(C.replication_index())
        return r, [run_case(case, r) for case in cases]

    return cases, dict(strategy.run(step))


@pytest.mark.parametrize("op", ["cross_replica_reduce", "reduce_scatter", "all_gather",
                                "all_to_all", "broadcast"])
def test_every_case_matches_the_oracle(results, op):
    cases, per_replica = results
    checked = 0
    for i, case in enumerate(cases):
        if case.op != op:
            continue
        for r in range(R):
            assert_same(per_replica[r][i], oracle(case, r, R), f"{case.key} on replica {r}")
            checked += 1
    assert checked >= R * 6 * 6  # every group and dtype at least


def test_cases_cover_every_operator_group_and_dtype(results):
    cases, _ = results
    assert {c.operator for c in cases if c.op == "reduce_scatter"} == \
        {o.name for o in C.CollectiveOperator}
    assert {c.group.type for c in cases} == set(C.CommGroupType)
    assert {c.dtype for c in cases} == set(DTYPES)


def test_seed_reduce_scatter_example(strategy):
    # seed 004:5313-5334: R0 [x0,y0,z0], R1 [x1,y1,z1] -> R0 [x0+x1, y0+y1], R1 [z0+z1, 0]
    def step():
        r = int(C.replication_index())
        x = np.array([1.0, 2.0, 3.0]) * (10 ** r)
        return C.reduce_scatter(x, 2)

    out = strategy.run(step)
    for pair in range(0, R, 2):
        x0, x1 = np.array([1.0, 2.0, 3.0]) * 10 ** pair, np.array([1.0, 2.0, 3.0]) * 10 ** (pair + 1)
        np.testing.assert_array_equal(out[pair], [x0[0] + x1[0], x0[1] + x1[1]])
        np.testing.assert_array_equal(out[pair + 1], [x0[2] + x1[2], 0.0])
        assert out[pair].shape == (2,)


def test_seed_cross_replica_sum_groups_are_consecutive(strategy):
    out = strategy.run(lambda: C.cross_replica_sum(np.float32(C.replication_index()), 4))
    assert [float(v) for v in out] == [6.0] * 4 + [22.0] * 4
    assert out[0].dtype == np.float32 and out[0].shape == ()


def test_seed_all_gather_shape_and_mean(strategy):
    out = strategy.run(lambda: (C.all_gather(np.full((2, 3), C.replication_index()), 2),
                                C.cross_replica_mean(np.float64(C.replication_index()))))
    for r, (gathered, mean) in enumerate(out):
        assert gathered.shape == (2, 2, 3)
        assert gathered[0, 0, 0] == r - r % 2 and gathered[1, 0, 0] == r - r % 2 + 1
        assert mean == 3.5


def test_all_to_all_is_xla_alltoall(strategy):
    # replica r holds [r*10 + j for j in range(8)]; block q goes to replica q.
    out = strategy.run(lambda: C.all_to_all(
        np.arange(R) + 10 * int(C.replication_index()), 0, 0, R))
    for q in range(R):
        np.testing.assert_array_equal(out[q], [10 * p + q for p in range(R)])


def test_results_are_independent_arrays(strategy):
    out = strategy.run(lambda: C.cross_replica_sum(np.ones(4)))
    out[0][0] = 99
    assert out[1][0] == 8 and all(isinstance(o, np.ndarray) for o in out)


def test_operator_names_and_enum_agree(strategy):
    assert C.COLLECTIVE_OP_SQUARE_ADD == "COLLECTIVE_OP_SQUARE_ADD"
    out = strategy.run(lambda: (C.cross_replica_reduce(np.int32(2), C.CollectiveOperator.MUL),
                                C.cross_replica_reduce(np.int32(2), "COLLECTIVE_OP_MUL"),
                                C.reduce_scatter(np.array([3.0]), 8, op="SQUARE_ADD")))
    assert out[0][0] == out[0][1] == 256
    assert out[0][2][0] == 72.0 and out[1][2][0] == 0.0


@pytest.mark.parametrize("dtype", ["uint8", "complex64", "float128", "int16", "<U3"])
def test_unsupported_dtype_is_a_type_error_naming_it(strategy, dtype):
    try:
        x = np.zeros(2, dtype=dtype)
    except TypeError:
        pytest.skip(f"numpy has no {dtype} here")
    for call in (C.cross_replica_sum, C.all_gather, C.broadcast):
        with pytest.raises(TypeError, match=re.escape(str(np.dtype(dtype)))):
            strategy.run(lambda: call(x))


def test_bool_needs_a_logical_operator(strategy):
    with pytest.raises(TypeError, match="bool"):
        strategy.run(lambda: C.cross_replica_sum(np.ones(2, bool)))
    with pytest.raises(TypeError, match="bool"):
        strategy.run(lambda: C.reduce_scatter(np.ones(2, bool), 2, op="MAX"))


@pytest.mark.parametrize("call", [
    lambda: C.cross_replica_sum(np.ones(2), 3),
    lambda: C.all_gather(np.ones(2), 5),
    lambda: C.reduce_scatter(np.ones(2), 6),
    lambda: C.all_to_all(np.ones(6), 0, 0, 3),
    lambda: C.cross_replica_mean(np.ones(2), group=C.CommGroup(ORTHOGONAL, 3)),
    lambda: C.broadcast(np.ones(2), group=C.CommGroup(CONSECUTIVE, 16)),
], ids=["sum", "gather", "scatter", "alltoall", "mean-orthogonal", "broadcast-16"])
def test_group_size_not_dividing_the_replicas_raises(strategy, call):
    with pytest.raises(ValueError, match="does not divide the number of replicas"):
        strategy.run(call)


@pytest.mark.parametrize("call, match", [
    (lambda: C.reduce_scatter(np.ones((2, 2)), 2), "rank 1"),
    (lambda: C.all_to_all(np.ones((4, 3)), 2, 0, 2), "split_dimension=2"),
    (lambda: C.all_to_all(np.ones((4, 3)), 1, 0, 2), "not divisible by the group size 2"),
    (lambda: C.broadcast(np.ones(2), 2, group=C.CommGroup(CONSECUTIVE, 2)), "root_replica=2"),
    (lambda: C.cross_replica_sum(np.ones(2), 2, group=C.CommGroup()), "not both"),
    (lambda: C.cross_replica_reduce(np.ones(2), "AVERAGE"), "COLLECTIVE_OP_MEAN"),
])
def test_bad_arguments_raise_value_errors(strategy, call, match):
    with pytest.raises(ValueError, match=match):
        strategy.run(call)


def test_argument_errors_leave_the_collectives_usable(strategy):
    with pytest.raises(ValueError):
        strategy.run(lambda: C.cross_replica_sum(np.ones(2), 3))
    assert strategy.run(lambda: C.cross_replica_sum(np.ones(1)))[0][0] == R


def test_outside_a_replica_function_raises():
    from ipu_node.errors import NotInReplicaError
    with pytest.raises(NotInReplicaError, match="all_gather"):
        C.all_gather(np.ones(2))
