"""The Horovod API, run by every rank of a job at once (Horovod's own test pattern):

    mpirun -n 4 python -m pytest tests/perrank_horovod -q
    poprun -n 2 [--transport grpc] python -m pytest tests/perrank_horovod -q

Every rank's input is a known function of its rank, so each rank computes the expected
result with numpy alone (the oracles below never call the API). Size-agnostic.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives.horovod as hvd
from collectives import CollectiveMismatchError


DTYPES = ("float16", "float32", "float64", "int32", "int64")


def contribution(r: int, dtype, shape=(3, 4)) -> np.ndarray:
    """Rank r's input: small integers (exact in every dtype), different on every rank."""
    n = int(np.prod(shape))
    return ((np.arange(n) * (r + 2) + 3 * r) % 7 + 1).reshape(shape).astype(dtype)


def horovod_scale(x: np.ndarray, factor: float) -> np.ndarray:
    """The oracle of Horovod's CPU ScaleBuffer, written independently."""
    if factor == 1.0:
        return x
    if x.dtype == np.float16:
        return (x.astype(np.float32) * np.float32(factor)).astype(np.float16)
    if x.dtype == np.float32:
        return (x * np.float32(factor)).astype(np.float32)
    if x.dtype == np.float64:
        return x * factor
    return np.array([int(v * factor) for v in x.ravel().tolist()], x.dtype).reshape(x.shape)


def expected_reduce(op, dtype, n, pre=1.0, post=1.0):
    parts = [horovod_scale(contribution(r, dtype), pre) for r in range(n)]
    fn = {hvd.Sum: np.add, hvd.Average: np.add, hvd.Min: np.minimum, hvd.Max: np.maximum,
          hvd.Product: np.multiply}[op]
    total = parts[0]
    for p in parts[1:]:
        total = fn(total, p).astype(dtype)
    if op == hvd.Average:
        post = post / n
    return horovod_scale(total, post)


def test_ranks_and_hosts():
    n, r = hvd.size(), hvd.rank()
    assert hvd.is_initialized() and 0 <= r < n
    hvd.init()  # idempotent
    info = hvd.allgather_object((hvd.rank(), hvd.local_rank(), hvd.local_size(),
                                 hvd.cross_rank(), hvd.cross_size()))
    # one host: local ranks are the ranks, one process per "cross" group
    assert info == [(q, q, n, 0, 1) for q in range(n)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["Sum", "Average", "Min", "Max", "Product"])
def test_allreduce_every_op_and_dtype(op, dtype):
    n, r = hvd.size(), hvd.rank()
    x = contribution(r, dtype)
    out = hvd.allreduce(x, op=op, name=f"{op}.{dtype}")
    want = expected_reduce(op, dtype, n)
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    np.testing.assert_array_equal(out, want)
    assert out is not x and np.array_equal(x, contribution(r, dtype))  # input untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_prescale_postscale_and_default_average(dtype):
    n, r = hvd.size(), hvd.rank()
    got = hvd.allreduce(contribution(r, dtype), op=hvd.Sum, prescale_factor=0.5,
                        postscale_factor=3.0)
    np.testing.assert_array_equal(got, expected_reduce("Sum", dtype, n, 0.5, 3.0))
    avg = hvd.allreduce(contribution(r, dtype), prescale_factor=1.5)  # op None: Average
    np.testing.assert_array_equal(avg, expected_reduce("Average", dtype, n, 1.5))


def test_adasum_of_two_or_more_ranks():
    n, r = hvd.size(), hvd.rank()

    def combine(a, b):
        dot = float(a @ b)
        return (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b

    def tree(items):
        if len(items) == 1:
            return items[0]
        p = 1 << ((len(items) - 1).bit_length() - 1)
        return combine(tree(items[:p]), tree(items[p:]))

    parts = [contribution(q, np.float64, (5,)) for q in range(n)]
    got = hvd.allreduce(contribution(r, np.float64, (5,)), op=hvd.Adasum)
    np.testing.assert_allclose(got, tree(parts), rtol=1e-12)
    with pytest.raises(TypeError):
        hvd.allreduce(np.ones(3, np.int32), op=hvd.Adasum)


def test_grouped_and_in_place_allreduce():
    n, r = hvd.size(), hvd.rank()
    tensors = [contribution(r, d, (i + 1, 2)) for i, d in enumerate(DTYPES)]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for t, o in zip(tensors, outs):
        want = sum(contribution(q, t.dtype, t.shape).astype(np.float64) for q in range(n))
        np.testing.assert_array_equal(o, want.astype(t.dtype))
    mine = [t.copy() for t in tensors]
    assert hvd.grouped_allreduce_(mine, op=hvd.Sum) is not None
    for m, o in zip(mine, outs):
        np.testing.assert_array_equal(m, o)
    x = contribution(r, np.float32)
    assert hvd.allreduce_(x, op=hvd.Max) is x
    np.testing.assert_array_equal(x, expected_reduce("Max", np.float32, n))


@pytest.mark.parametrize("dtype", DTYPES + ("bool",))
def test_allgather_with_different_first_dimensions(dtype):
    n, r = hvd.size(), hvd.rank()

    def mine(q):
        return (contribution(q, np.int64, (q + 1, 2)) % 2).astype(dtype)

    out = hvd.allgather(mine(r))
    np.testing.assert_array_equal(out, np.concatenate([mine(q) for q in range(n)]))
    outs = hvd.grouped_allgather([mine(r), np.full((2,), r, dtype)])
    np.testing.assert_array_equal(outs[0], out)
    np.testing.assert_array_equal(outs[1], np.repeat(np.arange(n), 2).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES + ("bool",))
def test_broadcast_from_every_root(dtype):
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        x = (contribution(r, np.int64) % 2).astype(dtype)
        out = hvd.broadcast(x, root)
        np.testing.assert_array_equal(out, (contribution(root, np.int64) % 2).astype(dtype))
        assert hvd.broadcast_(x, root) is x
        np.testing.assert_array_equal(x, out)


def test_broadcast_parameters_and_objects():
    n, r = hvd.size(), hvd.rank()
    params = {"w": contribution(r, np.float32), "b": np.full(3, r, np.int64)}
    hvd.broadcast_parameters(params, root_rank=n - 1)
    np.testing.assert_array_equal(params["w"], contribution(n - 1, np.float32))
    np.testing.assert_array_equal(params["b"], np.full(3, n - 1))
    obj = {"rank": r, "t": (1.5, None, b"x"), 7: [np.arange(3) * r, np.float32(r)]}
    got = hvd.broadcast_object(obj, root_rank=0)
    assert got["rank"] == 0 and got["t"] == (1.5, None, b"x")
    np.testing.assert_array_equal(got[7][0], np.zeros(3)) and got[7][1] == np.float32(0)
    assert hvd.allgather_object({"r": r}) == [{"r": q} for q in range(n)]
    with pytest.raises(TypeError, match="set"):
        hvd.allgather_object({1, 2})  # no pickle: sets are not sent
    assert hvd.allgather_object("ok") == ["ok"] * n  # and the next call works


def test_alltoall_equal_and_with_splits():
    n, r = hvd.size(), hvd.rank()
    x = np.arange(2 * n, dtype=np.int32) + 100 * r
    np.testing.assert_array_equal(
        hvd.alltoall(x), np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * q
                                         for q in range(n)]))

    def splits(q):  # rank q sends j rows (+q) to rank j; some splits are 0
        return [(j + q) % 3 for j in range(n)]

    def rows(q):
        total = sum(splits(q))
        return np.stack([np.arange(total) + 10 * q, np.full(total, q)], 1).astype(np.float32)

    out, received = hvd.alltoall(rows(r), splits=splits(r))
    want = [rows(q)[sum(splits(q)[:r]):sum(splits(q)[:r + 1])] for q in range(n)]
    np.testing.assert_array_equal(out, np.concatenate(want))
    assert received.dtype == np.int32 and received.tolist() == [splits(q)[r] for q in range(n)]
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(rows(r), splits=[1] * (n + 1))


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_uneven_split(op):
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # rank 0 gets 3 rows, the others 2 (Horovod's split)
    x = contribution(r, np.float32, (rows, 3))
    out = hvd.reducescatter(x, op=op)
    full = sum(contribution(q, np.float32, (rows, 3)) for q in range(n)).astype(np.float32)
    if op == "Average":
        full = full * np.float32(1.0 / n)
    counts = [rows // n + (1 if j < rows % n else 0) for j in range(n)]
    lo = sum(counts[:r])
    np.testing.assert_array_equal(out, full[lo:lo + counts[r]])
    outs = hvd.grouped_reducescatter([x, contribution(r, np.int64, (n, 2))], op=hvd.Sum)
    assert outs[1].shape == (1, 2)
    np.testing.assert_array_equal(
        outs[1], sum(contribution(q, np.int64, (n, 2)) for q in range(n))[r:r + 1])
    for extreme, fn in ((hvd.Max, np.maximum), (hvd.Min, np.minimum)):  # Horovod #3709
        got = hvd.reducescatter(x, op=extreme)
        want = contribution(0, np.float32, (rows, 3))
        for q in range(1, n):
            want = fn(want, contribution(q, np.float32, (rows, 3)))
        np.testing.assert_array_equal(got, want[lo:lo + counts[r]])
    with pytest.raises(ValueError, match="no Adasum"):
        hvd.reducescatter(x, op=hvd.Adasum)


def test_process_sets():
    n, r = hvd.size(), hvd.rank()
    evens = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([q for q in range(n) if q % 2 == 1])) \
        if n > 1 else None
    try:
        mine, other = (evens, odds) if r % 2 == 0 else (odds, evens)
        members = mine.ranks
        out = hvd.allreduce(contribution(r, np.int32), op=hvd.Sum, process_set=mine)
        np.testing.assert_array_equal(out, sum(contribution(q, np.int32) for q in members))
        got = hvd.allgather(np.full((1,), r, np.int64), process_set=mine)
        assert got.tolist() == members and mine.rank() == members.index(r)
        assert mine.size() == len(members) and mine.included()
        b = hvd.broadcast(np.full(2, r, np.float32), root_rank=members[-1],
                          process_set=mine)   # a global rank, as Horovod's
        assert b.tolist() == [members[-1]] * 2
        with pytest.raises(ValueError, match="not a rank of the process set"):
            hvd.broadcast(np.ones(2), root_rank=other.ranks[0] if other else n,
                          process_set=mine)
        if other is not None:
            assert not other.included()
            with pytest.raises(ValueError, match="not in process set"):
                hvd.allreduce(np.ones(2), process_set=other)
        hvd.barrier(process_set=mine)
    finally:
        assert hvd.remove_process_set(evens)
        if odds is not None:
            assert hvd.remove_process_set(odds)
    assert not hvd.remove_process_set(hvd.global_process_set)
    assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == n


def test_join_last_rank_contributes_zeros():
    n, r = hvd.size(), hvd.rank()
    # rank q has q + 1 batches: rank 0 joins first, rank n-1 last
    for step in range(n):
        if step > r:
            break
        s = hvd.allreduce(np.full(3, r + 1, np.float64), op=hvd.Sum)
        want = sum(q + 1 for q in range(n) if q >= step)
        assert s.tolist() == [want] * 3
        hvd.barrier()  # a joined rank counts (Horovod's)
    assert hvd.join() == n - 1
    assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == n  # usable after join


_DISAGREEMENTS = {
    "shape": lambda r: hvd.allreduce(np.ones(4 + (r == 0), np.float32), name="w"),
    "ndim": lambda r: hvd.allreduce(np.ones((4,) if r else (2, 2), np.float32)),
    "dtype": lambda r: hvd.allreduce(np.ones(4, np.float32 if r else np.float64)),
    "op": lambda r: hvd.allreduce(np.ones(4), op=hvd.Sum if r else hvd.Max),
    "scale": lambda r: hvd.allreduce(np.ones(4), prescale_factor=1.0 + (r == 0)),
    "root": lambda r: hvd.broadcast(np.ones(4), root_rank=0 if r else 1),
    "kind": lambda r: (hvd.allreduce(np.ones(4)) if r else hvd.allgather(np.ones(4))),
    "trailing": lambda r: hvd.allgather(np.ones((1, 2 + (r == 0)))),
    "name": lambda r: hvd.allreduce(np.ones(2), name="a" if r else "b"),
}


@pytest.mark.parametrize("what", sorted(_DISAGREEMENTS))
def test_disagreement_raises_on_every_rank_then_works(what):
    n, r = hvd.size(), hvd.rank()
    with pytest.raises(CollectiveMismatchError, match="ranks disagree") as info:
        _DISAGREEMENTS[what](r)
    assert "rank 0" in str(info.value)
    assert hvd.allreduce(np.ones(2), op=hvd.Sum).tolist() == [n, n]


@pytest.mark.parametrize("call, message", [
    (lambda: hvd.broadcast(np.ones(2), root_rank=1),
     "Broadcast is not supported with Join at this time."),
    (lambda: hvd.allgather(np.ones((1, 2))),
     "Allgather is not supported with Join at this time. Specify sparse_to_dense=True"),
    (lambda: hvd.reducescatter(np.ones((4, 2))),
     "Reducescatter is not supported with Join at this time."),
], ids=["broadcast", "allgather", "reducescatter"])
def test_after_a_rank_joined_the_others_calls_it_cannot_serve_raise_and_join_returns(
        call, message):
    # Horovod's: the others raise (its messages); the joined rank goes on waiting in join,
    # which returns once they join too
    n, r = hvd.size(), hvd.rank()
    if r == 0:
        assert hvd.join() == n - 1
    else:
        with pytest.raises(CollectiveMismatchError, match=message):
            call()
        s = hvd.allreduce(np.full(2, r, np.float64), op=hvd.Sum)  # rank 0 adds zeros
        assert s.tolist() == [sum(range(1, n))] * 2
        assert hvd.join() == n - 1
    assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == n


def test_average_is_accepted_with_horovods_deprecation_and_not_beside_op():
    n, r = hvd.size(), hvd.rank()
    x = np.full(2, r + 1, np.float64)
    with pytest.warns(DeprecationWarning, match="Parameter `average` has been replaced"):
        assert hvd.allreduce(x, average=False).tolist() == [n * (n + 1) / 2] * 2
    with pytest.warns(DeprecationWarning):
        assert hvd.allreduce(x, True).tolist() == [(n + 1) / 2] * 2   # positional: average
    with pytest.raises(ValueError, match="The op parameter supersedes average. Please "
                                         "provide only one of them."):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    # horovod.torch's positional order: tensor, average, name, compression, op, pre, post
    got = hvd.allreduce(x, None, "pos", hvd.Compression.none, hvd.Sum, 2.0, 0.5)
    assert got.tolist() == [n * (n + 1) / 2] * 2


def test_zero_dimensional_tensors_stay_zero_dimensional():
    n, r = hvd.size(), hvd.rank()
    got = hvd.allreduce(np.float32(r), op=hvd.Sum)
    assert isinstance(got, np.ndarray) and got.shape == () and got == sum(range(n))
    assert hvd.broadcast(np.array(r + 5), root_rank=n - 1).shape == ()
    outs = hvd.grouped_allreduce([np.float64(r), np.ones((2,))], op=hvd.Average)
    assert outs[0].shape == () and outs[1].shape == (2,)
    assert hvd.allreduce_(np.array(1.0), op=hvd.Sum) == n


@pytest.mark.parametrize("call, error, message", [
    # Horovod's own argument errors, raised on every rank instead of a hang on the others
    (lambda r: hvd.alltoall(np.arange(2 * hvd.size()),
                            splits=[2.5] * hvd.size() if r == 1 else [2] * hvd.size()),
     ValueError, "alltoall expects splits to contain 32-bit integer elements."),
    (lambda r: hvd.alltoall(np.arange(4), splits=[1] * (hvd.size() + (r == 1))),
     ValueError, "Number of entries in splits does not equal number of workers."),
    (lambda r: hvd.reducescatter(np.float32(1.0)),
     ValueError, "Process-set rank zero tried to REDUCESCATTER a rank-zero tensor."),
    (lambda r: hvd.allgather(np.float32(1.0)),
     ValueError, "Process-set rank zero tried to ALLGATHER a rank-zero tensor."),
    (lambda r: hvd.broadcast(np.ones(2), root_rank=hvd.size() + (r == 1)),
     ValueError, "broadcast received invalid root rank"),
    (lambda r: hvd.allreduce(np.ones(2, bool if r == 1 else np.float32)),
     TypeError, "bool tensors cannot be reduced"),
    (lambda r: hvd.allreduce(np.ones(2), op="Median" if r == 1 else hvd.Sum),
     ValueError, "unknown op 'Median'"),
], ids=["float-splits", "splits-count", "reducescatter-0d", "allgather-0d", "root",
        "bool", "op"])
def test_an_argument_error_of_one_rank_is_raised_on_every_rank(call, error, message):
    n, r = hvd.size(), hvd.rank()
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        call(r)
    assert hvd.allreduce(np.ones(1), op=hvd.Sum)[0] == n   # the set stays usable


def _barrier_times(delay_s: float):
    import time
    r = hvd.rank()
    time.sleep(delay_s * r)          # the last rank arrives last
    arrived = time.time()
    hvd.barrier()
    left = time.time()
    return hvd.allgather_object((arrived, left))


@pytest.mark.parametrize("after", ["nothing", "argument-error", "disagreement", "join-error"])
def test_a_barrier_never_returns_before_every_rank_reached_it(after):
    # also after an earlier error of the same job: each error leaves every rank at the
    # same call, so the barrier's agreement still needs every rank's part
    n, r = hvd.size(), hvd.rank()
    if after == "argument-error":
        with pytest.raises(ValueError):
            hvd.alltoall(np.arange(4), splits=[1.5] * n if r == 0 else [1] * n)
    elif after == "disagreement":
        with pytest.raises(CollectiveMismatchError):
            hvd.allreduce(np.ones(2 + r))
    elif after == "join-error":
        if r == 0:
            hvd.join()
        else:
            with pytest.raises(CollectiveMismatchError):
                hvd.broadcast(np.ones(1), root_rank=1)
            hvd.join()
    times = _barrier_times(0.2)
    last_arrival = max(a for a, _ in times)
    assert all(left >= last_arrival for _, left in times), times
