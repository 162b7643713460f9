"""Large tensors across the instances (run by every instance, like
test_perrank_collectives.py): sizes on both sides of the thresholds that change how the
bytes move (``PAIR_ALLREDUCE_MAX_BYTES``: the pair exchange or reduce-scatter + all-gather;
``P2P_MIN_BYTES`` of the MPI transport: point-to-point or MPI's collective), uneven ones
included, against the numpy oracles of ``tests.collective_cases``: the path never changes a
result's bytes."""

from __future__ import annotations

import pytest

import collectives as C
from collectives._engine import exchange as _exchange
from poprun import popdist
from tests.collective_cases import ALL, Case, check_cases

pytestmark = pytest.mark.skipif(not popdist.isPopdistEnvSet(),
                                reason="per-rank suite: run under poprun")

_PAIR = _exchange.PAIR_ALLREDUCE_MAX_BYTES


def _groups(R: int) -> list:
    """ALL, and from 4 replicas orthogonal groups of R's largest proper divisor (R // 2
    when R is even; none when R is prime)."""
    size = next((R // p for p in range(2, R) if R % p == 0), 1)
    return [ALL] + ([C.CommGroup(C.CommGroupType.ORTHOGONAL, size)] if size > 1 else [])


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
    check_cases(strategy, _cases(strategy.num_replicas_in_sync))
