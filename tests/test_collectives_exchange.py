"""The exchange of the reductions (``collectives._engine.exchange.Exchange``) between m members
played by threads of this process, over an in-memory communicator: every path (the pair
exchange of two members, reduce-scatter + all-gather, reduce-scatter alone) gives the
canonical tree's bytes for every operator and dtype, at uneven sizes and with several
partials, so the size that picks a path never changes a result; members that send one
partial per node of their blocks (``nodes``) get the tree of the positions. And
the large cases of the per-rank suite (tests/perrank/test_perrank_large.py) on three
instances of one replica each (a group whose tree is not a power of two, over MPI
point-to-point)."""

from __future__ import annotations

import re
import threading
from typing import Sequence

import numpy as np
import pytest

from collectives._engine import exchange
from collectives.operators import CollectiveOperator, combine_into
from collectives.options import CollectiveOptions
from collectives._engine.tree import block_nodes
from collectives.transports.base import Communicator, Done
from collectives.waiting import Patience
from tests.procs import PYTHON
from tests.procs import run_poprun as poprun

_TIMEOUT_S = 20.0


class _Board:
    """What the members of one in-memory communicator post for each other."""

    def __init__(self, m: int):
        self.posted: list = [None] * m
        self.barrier = threading.Barrier(m, timeout=_TIMEOUT_S)

    def swap(self, rank: int, mine):
        """Post ``mine``; return what every member posted (after all have posted)."""
        self.posted[rank] = mine
        self.barrier.wait()
        everyone = list(self.posted)
        self.barrier.wait()  # nobody posts again before all have read
        return everyone


class _ThreadCommunicator(Communicator):
    """Member ``rank`` of an in-memory communicator (one thread per member)."""

    def __init__(self, board: _Board, rank: int):
        self.board, self.rank = board, rank
        self.members = tuple(range(len(board.posted)))

    def allgatherv(self, send, recv, counts: Sequence[int], patience, *, posted=None):
        at = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        mine = recv[at[self.rank]:at[self.rank + 1]] if send is None else send
        got = self.board.swap(self.rank, mine.copy())
        assert [g.nbytes for g in got] == list(counts)
        recv[:at[-1]] = np.concatenate(got) if got else np.zeros(0, np.uint8)
        return Done(recv)

    def alltoallv(self, send, send_counts: Sequence[int], recv, recv_counts: Sequence[int],
                  patience, *, posted=None):
        at = np.concatenate([[0], np.cumsum(send_counts)]).astype(int)
        pieces = [send[at[j]:at[j + 1]].copy() for j in range(self.size)]
        everyone = self.board.swap(self.rank, pieces)
        got = [everyone[j][self.rank] for j in range(self.size)]
        assert [g.nbytes for g in got] == list(recv_counts)
        out = np.concatenate(got) if got else np.zeros(0, np.uint8)
        recv[:out.size] = out
        return Done(recv[:out.size])

    def broadcast(self, data, root: int, patience, *, posted=None):
        data[...] = self.board.swap(self.rank, data.copy())[root]
        return Done(data)


def _exchange(comm, partials, op, patience, bounds=None, gather=True, nodes=None):
    """The results of an :class:`~collectives._engine.exchange.Exchange` of ``partials``."""
    first = partials[0] if nodes is None else partials[0][0]
    sizes = [(p if nodes is None else p[0]).size for p in partials]
    ex = exchange.Exchange(exchange.Scratch(), comm, patience, sizes, first.dtype, op, gather,
                           bounds, nodes)
    return ex.finish(ex.start(partials))


def _in_threads(m: int, work) -> list:
    """``work(comm)`` on each of m members at once; their results in member order."""
    board = _Board(m)
    results: list = [None] * m
    errors: list = []

    def member(rank: int) -> None:
        try:
            results[rank] = work(_ThreadCommunicator(board, rank))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            board.barrier.abort()

    threads = [threading.Thread(target=member, args=(r,)) for r in range(m)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a member hung"
    if errors:
        raise errors[0]
    return results


def _tree(items: list, op: CollectiveOperator) -> np.ndarray:
    if len(items) == 1:
        return items[0]
    p = 1 << ((len(items) - 1).bit_length() - 1)
    return combine_into(op, _tree(items[:p], op), _tree(items[p:], op), None)


def _partials(m: int, sizes: Sequence[int], dtype: str, seed: int) -> list[list[np.ndarray]]:
    """Per member, one partial per size: values whose sums depend on the order."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(m):
        if dtype == "bool":
            out.append([rng.random(n) < 0.5 for n in sizes])
        elif dtype.startswith("int"):
            out.append([rng.integers(-1000, 1000, n).astype(dtype) for n in sizes])
        else:
            out.append([(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n))
                        .astype(dtype) for n in sizes])
    return out


_CASES = [(CollectiveOperator.ADD, "float32"), (CollectiveOperator.ADD, "float16"),
          (CollectiveOperator.ADD, "float64"), (CollectiveOperator.ADD, "int64"),
          (CollectiveOperator.MUL, "float32"), (CollectiveOperator.MIN, "int32"),
          (CollectiveOperator.MAX, "float64"), (CollectiveOperator.LOGICAL_AND, "bool"),
          (CollectiveOperator.LOGICAL_OR, "bool")]


@pytest.mark.parametrize("op, dtype", _CASES, ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("m", [2, 3, 4])
def test_every_allreduce_path_gives_the_tree(monkeypatch, m, op, dtype):
    sizes = [1, 7, 1001, 70001]  # uneven: chunks of different lengths, some empty
    partials = _partials(m, sizes, dtype, seed=m)
    want = [_tree([partials[j][i] for j in range(m)], op) for i in range(len(sizes))]
    options = CollectiveOptions(stall_warning_s=_TIMEOUT_S, timeout_s=_TIMEOUT_S)
    for limit in (0, 1 << 40):  # reduce-scatter + all-gather; the pair exchange (m = 2)
        monkeypatch.setattr(exchange, "PAIR_ALLREDUCE_MAX_BYTES", limit)
        for single in (True, False):
            chosen = sizes[-1:] if single else sizes
            index = [sizes.index(n) for n in chosen]

            def work(comm, index=index):
                mine = [partials[comm.rank][i] for i in index]
                return _exchange(comm, mine, op,
                                 Patience("test", options, lambda: "?", committed=True))

            for rank, got in enumerate(_in_threads(m, work)):
                for i, result in zip(index, got):
                    what = f"m={m} limit={limit} single={single} member {rank} size {sizes[i]}"
                    assert result.dtype == want[i].dtype, what
                    assert result.shape == want[i].shape, what
                    assert result.tobytes() == want[i].tobytes(), what


@pytest.mark.parametrize("op, dtype", _CASES[:5], ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("m", [2, 3, 4])
def test_reduce_scatter_exchange_gives_each_owner_its_part_of_the_tree(m, op, dtype):
    c = 3001  # elements each member owns; a second partial split unevenly
    uneven = [0, 5, 5 + 17, 5 + 17 + 1000][:m] + [2 * c]
    partials = _partials(m, [m * c, 2 * c], dtype, seed=10 + m)
    even = list(range(0, m * c + 1, c))
    totals = [_tree([partials[j][i] for j in range(m)], op) for i in range(2)]
    options = CollectiveOptions(stall_warning_s=_TIMEOUT_S, timeout_s=_TIMEOUT_S)

    def work(comm):
        return _exchange(comm, partials[comm.rank], op,
                         Patience("test", options, lambda: "?", committed=True),
                         bounds=[even, uneven], gather=False)

    for rank, (first, second) in enumerate(_in_threads(m, work)):
        assert first.tobytes() == totals[0][even[rank]:even[rank + 1]].tobytes(), rank
        assert second.tobytes() == totals[1][uneven[rank]:uneven[rank + 1]].tobytes(), rank


@pytest.mark.parametrize("op, dtype", _CASES[:5], ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("n, blocks", [(3, ((0, 1), (1, 3))), (6, ((0, 3), (3, 6))),
                                       (6, ((0, 4), (4, 5), (5, 6))),
                                       (9, ((0, 3), (3, 6), (6, 9)))])
def test_subtree_exchange_gives_the_tree_of_the_positions(n, blocks, op, dtype):
    # members whose positions are not one node each send one partial per node of their
    # block: allreduce and reduce-scatter (owned regions: the members' positions) give the
    # tree of the n positions, for two reductions at once (uneven sizes, one empty chunk)
    nodes = block_nodes(n, blocks)
    assert nodes is not None
    m, c = len(blocks), 1001
    values = _partials(n, [n * c, 5], dtype, seed=20 + n)  # per position
    want = [_tree([values[p][i] for p in range(n)], op) for i in range(2)]
    options = CollectiveOptions(stall_warning_s=_TIMEOUT_S, timeout_s=_TIMEOUT_S)
    rs_bounds = [[lo * c for lo, _ in blocks] + [n * c], [0] * m + [5]]

    def mine(rank):  # per reduction, this member's partial of each of its nodes
        return [[_tree([values[p][i] for p in range(a, b)], op) for a, b in nodes[rank]]
                for i in range(2)]

    def work(comm):
        patience = Patience("test", options, lambda: "?", committed=True)
        whole = _exchange(comm, mine(comm.rank), op, patience, nodes=nodes)
        owned = _exchange(comm, mine(comm.rank), op, patience, bounds=rs_bounds,
                          gather=False, nodes=nodes)
        return whole, owned

    for rank, (whole, owned) in enumerate(_in_threads(m, work)):
        for i in range(2):
            assert whole[i].tobytes() == want[i].tobytes(), (rank, i)
            b = rs_bounds[i]
            assert owned[i].tobytes() == want[i][b[rank]:b[rank + 1]].tobytes(), (rank, i)


@pytest.mark.slow
def test_large_cases_on_three_one_replica_instances():
    job = poprun(["-n", "3", "--num-replicas", "3", PYTHON, "-m", "pytest",
                  "tests/perrank/test_perrank_large.py", "-q", "-p", "no:cacheprovider"],
                 timeout_s=120)
    assert job.returncode == 0, job.stdout + job.stderr
    passed = re.findall(r"\[1,(\d+)\]<stdout>:1 passed in ", job.stdout)
    assert sorted(passed) == ["0", "1", "2"], job.stdout + job.stderr
