"""Large tensors across the instances (run by every instance, like
test_perrank_collectives.py): sizes on both sides of the thresholds that change how the
bytes move (``PAIR_ALLREDUCE_MAX_BYTES``: the pair exchange or reduce-scatter + all-gather;
``P2P_MIN_BYTES`` of the MPI transport: point-to-point or MPI's collective), uneven ones
included, against the numpy oracles of ``tests.collective_cases``: the path never changes a
result's bytes."""

from __future__ import annotations

import pytest

import collectives as C
from collectives import _algorithms
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist
from tests.collective_cases import ALL, Case, assert_same, oracle, run_case

pytestmark = pytest.mark.skipif(not popdist.isPopdistEnvSet(),
                                reason="per-rank suite: run under poprun")

_PAIR = _algorithms.PAIR_ALLREDUCE_MAX_BYTES


@pytest.fixture(scope="module")
def strategy():
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    return IPUMultiReplicaStrategy()


def _groups(R: int) -> list:
    return [ALL] + ([C.CommGroup(C.CommGroupType.ORTHOGONAL, R // 2)] if R >= 4 else [])


def _cases(R: int) -> list[Case]:
    cases = []
    for group in _groups(R):
        for elements in (_PAIR // 4, _PAIR // 4 + 1, 300_001):  # float32 bytes around it
            cases.append(Case("cross_replica_reduce", "float32", group, "ADD", (elements,)))
            cases.append(Case("reduce_scatter", "float32", group, "ADD", (elements,)))
        for dtype, operator in (("float16", "ADD"), ("int32", "MIN"), ("float64", "MEAN")):
            cases.append(Case("cross_replica_reduce", dtype, group, operator, (150_001,)))
            cases.append(Case("reduce_scatter", dtype, group, operator, (150_001,)))
        for dtype in ("float32", "int64"):
            cases.append(Case("all_gather", dtype, group, shape=(50_001, 3)))
            k = len(group.members(R)[0])
            cases.append(Case("all_to_all", dtype, group, shape=(k * 40_001,), params=(0, 0)))
            cases.append(Case("all_to_all", dtype, group, shape=(2 * k, 30_001),
                              params=(0, 1)))
            cases.append(Case("broadcast", dtype, group, shape=(100_001,), params=(k - 1,)))
    return cases


def test_large_cases_match_the_oracle_across_instances(strategy):
    R = strategy.num_replicas_in_sync
    cases = _cases(R)

    def step():
        r = int(C.replication_index())
        return r, [run_case(case, r) for case in cases]

    for r, results in strategy.run(step):
        for case, result in zip(cases, results):
            assert_same(result, oracle(case, r, R), f"{case.key} on replica {r}")
