"""poptorch.DataLoader and AsynchronousDataAccessor (poptorch reference §4, §11.1-2, §11.13)."""

import threading
import time

import pytest
import torch

import poptorch
from poptorch import enums


def _dataset(n: int):
    return torch.utils.data.TensorDataset(torch.arange(n, dtype=torch.float32).reshape(n, 1),
                                          torch.arange(n))


def test_combined_batch_size_and_length():  # §11.1
    opts = poptorch.Options().deviceIterations(4).replicationFactor(2)
    opts.Training.gradientAccumulation(3)
    loader = poptorch.DataLoader(opts, _dataset(1000), batch_size=5)
    assert loader.combinedBatchSize == 120 and len(loader) == 8
    assert all(x.shape[0] == 120 and y.shape[0] == 120 for x, y in loader)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(1)


def test_combined_batch_size_with_input_replica_grouping():  # §11.2
    opts = poptorch.Options().replicationFactor(4)
    opts.inputReplicaGrouping(2, enums.CommGroupType.Consecutive)
    assert poptorch.DataLoader(opts, _dataset(12), batch_size=3).combinedBatchSize == 6


def test_each_process_reads_a_contiguous_block():  # §11.13
    seen = []
    for p in range(3):
        opts = poptorch.Options()
        opts.Distributed.configureProcessId(p, 3)
        loader = poptorch.DataLoader(opts, _dataset(100), batch_size=4)
        assert len(loader) == 8
        items = torch.cat([y for _, y in loader]).tolist()
        assert items == list(range(32 * p, 32 * p + 32))
        seen += items
    assert len(seen) == 96


def test_drop_last_false_spreads_the_items_evenly():
    counts = []
    for p in range(3):
        opts = poptorch.Options()
        opts.Distributed.configureProcessId(p, 3)
        loader = poptorch.DataLoader(opts, _dataset(10), batch_size=1, drop_last=False)
        counts.append([int(y) for _, y in loader])
    assert counts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_shuffled_blocks_need_a_seed_and_share_one_permutation():
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(AssertionError, match="you must set poptorch.Options.randomSeed"):
        poptorch.DataLoader(opts, _dataset(40), batch_size=4, shuffle=True)
    epochs = []
    for p in range(2):
        opts = poptorch.Options().randomSeed(5)
        opts.Distributed.configureProcessId(p, 2)
        loader = poptorch.DataLoader(opts, _dataset(40), batch_size=4, shuffle=True)
        epochs.append([torch.cat([y for _, y in loader]).tolist() for _ in range(2)])
    for epoch in range(2):
        both = epochs[0][epoch] + epochs[1][epoch]
        assert sorted(both) == list(range(40)) and both != list(range(40))
    assert epochs[0][0] != epochs[0][1]  # a new permutation every epoch


def test_batch_sampler_batches_are_concatenated():
    opts = poptorch.Options().deviceIterations(2)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(12)), 3,
                                            drop_last=True)
    loader = poptorch.DataLoader(opts, _dataset(12), batch_sampler=sampler)
    assert [y.tolist() for _, y in loader] == [list(range(6)), list(range(6, 12))]
    with pytest.raises(poptorch.Error, match="mutually exclusive with batch_size, shuffle"):
        poptorch.DataLoader(poptorch.Options(), _dataset(12), batch_size=4,
                            batch_sampler=sampler)


def test_iterable_datasets_are_not_partitioned():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    with pytest.raises(AssertionError, match="auto_distributed_partitioning not supported for "
                                             "IterableDataset"):
        poptorch.DataLoader(opts, Stream(), batch_size=2)


def test_options_must_be_poptorch_options():
    with pytest.raises(AssertionError, match="needs a poptorch.Options"):
        poptorch.DataLoader(object(), _dataset(4))


class _Watched(torch.utils.data.Dataset):
    """Records which thread reads it; ``gate`` holds reads after the first ``free`` ones."""

    def __init__(self, n: int, free: int = 10 ** 9):
        self.n, self.threads, self.reads = n, set(), 0
        self.gate, self.free = threading.Event(), free
        self.blocked = threading.Event()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.reads >= self.free:
            self.blocked.set()
            self.gate.wait(10)
        self.reads += 1
        self.threads.add(threading.get_ident())
        return torch.tensor([float(i)]), torch.tensor(i)


def _until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_async_mode_loads_in_a_background_thread_with_a_bounded_buffer():
    data = _Watched(40, free=8)
    loader = poptorch.DataLoader(poptorch.Options(), data, batch_size=2,
                                 mode=enums.DataLoaderMode.Async,
                                 async_options={"buffer_size": 3, "early_preload": True})
    accessor = loader._accessor
    # before any next(): 3 batches queued and a 4th loaded, then the worker waits for room
    assert _until(lambda: data.reads == 8 and accessor._queue.full())
    assert not data.blocked.is_set() and threading.get_ident() not in data.threads
    it = iter(loader)
    assert next(it)[1].tolist() == [0, 1]
    assert data.blocked.wait(10)  # room for one more: it reads ahead again
    data.gate.set()
    assert torch.cat([y for _, y in it]).tolist() == list(range(2, 40))
    assert torch.cat([y for _, y in loader]).tolist() == list(range(40))  # next epoch
    loader.terminate()


def test_async_rebatched_gives_exact_combined_batches():
    opts = poptorch.Options().deviceIterations(3)
    loader = poptorch.DataLoader(opts, _dataset(20), batch_size=2, num_workers=0,
                                 mode=enums.DataLoaderMode.AsyncRebatched,
                                 rebatched_worker_size=4)
    batches = [y.tolist() for _, y in loader]
    assert batches == [list(range(0, 6)), list(range(6, 12)), list(range(12, 18))]
    assert len(loader) == 3
    with pytest.raises(AssertionError, match=r"rebatched_worker_size \(8\) must be <= to the "
                                             r"combined batch size \(6\)"):
        poptorch.DataLoader(opts, _dataset(20), batch_size=2,
                            mode=enums.DataLoaderMode.AsyncRebatched, rebatched_worker_size=8)
    loader.terminate()


def test_accessor_errors():
    opts = poptorch.Options()
    loader = poptorch.DataLoader(opts, _dataset(4), mode=enums.DataLoaderMode.Async)
    with pytest.raises(poptorch.Error, match="already uses an AsynchronousDataAccessor"):
        poptorch.AsynchronousDataAccessor(loader)
    loader.terminate()
    with pytest.raises(AssertionError, match="rebatched_size must be None or greater than 1"):
        poptorch.AsynchronousDataAccessor(_dataset(4), rebatched_size=1)

    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise OSError("disk gone")
    accessor = poptorch.AsynchronousDataAccessor(
        torch.utils.data.DataLoader(Broken(), batch_size=2))
    with pytest.raises(poptorch.Error, match="worker thread failed to start: OSError: disk gone"):
        next(iter(accessor))
    empty = poptorch.AsynchronousDataAccessor(
        torch.utils.data.DataLoader(_dataset(0), batch_size=2))
    with pytest.raises(poptorch.Error, match="The Dataset is empty"):
        next(iter(empty))
