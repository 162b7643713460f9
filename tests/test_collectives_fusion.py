"""Tensor fusion (collectives._engine.fusion): a collective on a nest gives every array what the op
gives it alone, bit for bit, moving few fused buffers; between the local replicas of one
instance (the layouts of several instances: test_collectives_multiprocess.py)."""

import numpy as np
import pytest

import collectives as C
import ipu_node
from collectives.strategies import IPUMultiReplicaStrategy
from tests.collective_cases import assert_same, nest_cases, run_case, run_nest


def _system(n: int, crs_limit: int = 0, rs_limit: int = 0) -> IPUMultiReplicaStrategy:
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = n
    cfg.optimizations.maximum_cross_replica_sum_buffer_size = crs_limit
    cfg.optimizations.maximum_reduce_scatter_buffer_size = rs_limit
    cfg.configure_ipu_system()
    return IPUMultiReplicaStrategy()


@pytest.fixture
def system():
    yield _system
    ipu_node.reset_ipu_configuration()


@pytest.mark.parametrize("limit", [0, 48])
def test_every_op_on_a_nest_equals_the_op_on_each_array(system, limit):
    strategy = system(4, limit, limit)
    nests = nest_cases(4)

    def step():
        r = int(C.replication_index())
        return {key: (run_nest(cases, r), [run_case(c, r) for c in cases])
                for key, cases in nests.items()}

    for r, results in enumerate(strategy.run(step)):
        for key, (fused, alone) in results.items():
            for case, got, want in zip(nests[key], fused, alone):
                assert_same(got, want, f"{key}: {case.key} on replica {r} (limit {limit})")


def test_a_nest_moves_one_buffer_per_dtype_or_per_limit(system):
    strategy = system(2)
    nest = {"a": np.ones(100, np.float32), "b": [np.ones((3, 4), np.float32), np.int32(1)]}
    C.reset_stats()
    strategy.run(lambda: C.cross_replica_sum(nest))
    records = C.call_records()
    assert sorted((r.dtype, r.shape) for r in records) == [("float32", (112,)),
                                                          ("int32", (1,))]
    ipu_node.reset_ipu_configuration()
    strategy = system(2, crs_limit=400)
    C.reset_stats()
    out = strategy.run(lambda: C.cross_replica_sum(nest))
    assert sorted(r.shape for r in C.call_records()) == [(1,), (12,), (100,)]
    assert out[0]["a"].tolist() == [2.0] * 100 and out[1]["b"][1] == 2
    assert C.stats()["cross_replica_sum"].calls == 3  # one modelled collective per buffer


def test_a_list_of_different_shapes_is_accepted_and_keeps_its_structure(system):
    strategy = system(2)
    out = strategy.run(lambda: C.cross_replica_sum([np.ones(3), np.ones((2, 2)), 1.0]))
    assert isinstance(out[0], list) and [a.shape for a in out[0]] == [(3,), (2, 2), ()]
    assert out[0][1].tolist() == [[2.0, 2.0], [2.0, 2.0]] and float(out[1][2]) == 2.0
    assert strategy.run(lambda: C.all_gather(()))[0] == ()


def test_a_bad_array_in_a_nest_is_named_and_nothing_is_poisoned(system):
    strategy = system(2)
    with pytest.raises(TypeError, match=r"cross_replica_sum: x\['b'\]\[1\]: dtype int8"):
        strategy.run(lambda: C.cross_replica_sum({"a": np.ones(2),
                                                 "b": [np.ones(2), np.ones(2, np.int8)]}))
    with pytest.raises(ValueError, match=r"reduce_scatter: x\[1\]: x must have rank 1"):
        strategy.run(lambda: C.reduce_scatter([np.ones(2), np.ones((2, 2))]))
    out = strategy.run(lambda: C.cross_replica_sum([np.ones(2)]))
    assert out[0][0].tolist() == [2.0, 2.0]


def test_replicas_whose_nests_differ_raise_a_mismatch(system):
    strategy = system(2)

    def step():
        r = int(C.replication_index())
        return C.cross_replica_sum([np.ones(3), np.ones(4)] if r else [np.ones(4), np.ones(3)])

    with pytest.raises(C.CollectiveMismatchError, match="params"):
        strategy.run(step)


def test_the_optimizations_options_have_the_seeds_defaults():
    opt = ipu_node.IPUConfig().optimizations
    assert (opt.merge_infeed_io_copies, opt.maximum_cross_replica_sum_buffer_size,
            opt.maximum_reduce_scatter_buffer_size, opt.maximum_inter_ipu_copies_buffer_size,
            opt.maximum_send_recv_cluster_size, opt.minimum_remote_tensor_size,
            opt.merge_remote_buffers) == (
        False, 0, 0, 0, 0, 128, ipu_node.MergeRemoteBuffersBehaviour.IF_BENEFICIAL)
    with pytest.raises(ValueError, match="maximum_cross_replica_sum_buffer_size"):
        opt.maximum_cross_replica_sum_buffer_size = -1
    with pytest.raises(AttributeError, match="valid options"):
        opt.maximum_cross_replica_sum_buffer = 1
