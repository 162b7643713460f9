"""``poptorch.DataLoader``: a ``torch.utils.data.DataLoader`` that yields PopTorch's combined
batches (poptorch reference §4, PT python/__init__.py).

The combined batch is ``batch_size x deviceIterations x (replicationFactor /
input_group_size) x gradientAccumulation`` rows: the first dimension of every tensor one
call of the model takes. Under several processes (``options.Distributed``, set from the
launcher or by ``popdist.poptorch.Options``) each process reads one contiguous block of the
data set (:class:`SubDataset`, PopTorch's ``_SubDataset``), as on a real POD.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data

from poptorch import enums
from poptorch.data._async import AsynchronousDataAccessor
from poptorch._errors import createPoptorchError
from poptorch._logging import logger
from poptorch.options._options import Options

__all__ = ["DataLoader", "SubDataset", "combined_batch_size"]


def combined_batch_size(options: Options, batch_size: int) -> int:
    """``batch_size x di x (R / k) x G``: rows of one call (reference §3.1)."""
    return (batch_size * options.device_iterations *
            (options.replication_factor // options.input_group_size) *
            options.Training.gradient_accumulation)


class SubDataset:
    """The block of a data set that one process of ``options.Distributed`` reads.

    ``drop_last``: ``per_proc = step x (len // (step x P))`` items, process p reads
    ``[p per_proc, (p+1) per_proc)``; else the items are spread evenly (the first
    ``len % P`` processes get one more), in order. With shuffling, :meth:`shuffle` draws a
    permutation of the whole data set from a generator seeded with ``randomSeed`` (the same
    on every process, continuing its state each epoch) and :meth:`swap_range` moves the
    block by the leftover count on alternate epochs so that leftovers get used.
    """

    def __init__(self, dataset, options: Options, step: int, drop_last: bool):
        num_elts = len(dataset)
        procs, proc = options.Distributed.numProcesses, options.Distributed.processId
        if drop_last:
            per_proc = step * (num_elts // (step * procs))
            self._offset = proc * per_proc
            self._length = max(0, min(per_proc, num_elts - self._offset))
            self._leftovers = num_elts % per_proc if per_proc else 0
        else:
            counts = [num_elts // procs + (num_elts % procs > p) for p in range(procs)]
            self._offset = sum(counts[:proc])
            self._length = counts[proc]
            self._leftovers = 0
        self._base_offset = self._offset
        self._dataset = dataset
        self._seed = options.random_seed if options.exists("random_seed") else None
        self._generator_state = None
        self._order = None

    def shuffle(self) -> None:
        """Draw the next global permutation (the same on every process)."""
        generator = torch.Generator()
        if self._generator_state is None:
            generator.manual_seed(self._seed)
        else:
            generator.set_state(self._generator_state)
        self._order = torch.randperm(len(self._dataset), generator=generator)
        self._generator_state = generator.get_state()

    def swap_range(self) -> None:
        """Alternate the block's offset between its base and base + leftovers."""
        if self._offset == self._base_offset:
            self._offset += self._leftovers
        else:
            self._offset = self._base_offset

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self._length:
            raise IndexError(f"index {index} out of range for a block of {self._length}")
        global_index = index + self._offset
        if self._order is not None:
            global_index = int(self._order[global_index])
        return self._dataset[global_index]


class _GroupedBatchSampler:
    """The batches of a user's ``batch_sampler``, ``n`` at a time, as one list of indices."""

    def __init__(self, batch_sampler, n: int):
        self.batch_sampler, self.n = batch_sampler, n

    def __iter__(self):
        group: list = []
        count = 0
        for batch in self.batch_sampler:
            group.extend(batch)
            count += 1
            if count == self.n:
                yield group
                group, count = [], 0

    def __len__(self) -> int:
        return len(self.batch_sampler) // self.n


class DataLoader(torch.utils.data.DataLoader):
    """PopTorch's data loader: batches of :attr:`combinedBatchSize` rows.

    Args:
        options: the ``poptorch.Options`` of the model it feeds (frozen here).
        dataset: a map-style or iterable ``torch.utils.data.Dataset``.
        batch_size: the micro-batch size; None: no batching (combinedBatchSize None).
        shuffle: reshuffle every epoch (across processes: needs ``options.randomSeed``).
        num_workers, persistent_workers (default ``num_workers > 0``), drop_last, **kwargs:
            as ``torch.utils.data.DataLoader``.
        auto_distributed_partitioning: give each process its own contiguous block.
        mode: ``DataLoaderMode.Sync``, ``Async`` or ``AsyncRebatched`` (a background
            :class:`~poptorch.AsynchronousDataAccessor`).
        async_options: keyword arguments of the accessor.
        rebatched_worker_size: AsyncRebatched: rows the loader makes per batch (default
            the combined batch size), re-batched by the accessor.
        batch_sampler: a batch sampler (exclusive with batch_size, shuffle and
            distributed partitioning); its batches are concatenated di x (R/k) x G at a time.

    Raises:
        AssertionError: ``options`` is not a ``poptorch.Options``; shuffling across
            processes without ``randomSeed``; auto partitioning of an IterableDataset over
            processes; ``rebatched_worker_size`` above the combined batch size.
        poptorch.Error: ``batch_sampler`` together with batch_size or shuffle.
    """

    def __init__(self, options: Options, dataset, batch_size: int | None = 1,
                 shuffle: bool = False, num_workers: int = 0, drop_last: bool = True,
                 persistent_workers: bool | None = None,
                 auto_distributed_partitioning: bool = True,
                 mode: enums.DataLoaderMode = enums.DataLoaderMode.Sync,
                 async_options: dict | None = None, rebatched_worker_size: int | None = None,
                 batch_sampler=None, **kwargs):
        if not isinstance(options, Options):
            raise AssertionError(f"poptorch.DataLoader needs a poptorch.Options, got "
                                 f"{type(options).__name__}")
        options._freeze()
        self._options = options
        shuffle = bool(shuffle)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        per_call = combined_batch_size(options, 1)
        if batch_sampler is not None:
            if batch_size not in (1, None) or shuffle:
                raise createPoptorchError("`batch_sampler` option is mutually exclusive with "
                                          "batch_size, shuffle.")
            batch_size = None
        self._combined_batch_size = None if batch_size is None else batch_size * per_call
        self._is_iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        self._shuffle_blocks = False
        procs = options.Distributed.numProcesses
        if self._is_iterable:
            if auto_distributed_partitioning and procs > 1:
                raise AssertionError("auto_distributed_partitioning not supported for "
                                     "IterableDataset")
            if num_workers > 1 and "worker_init_fn" not in kwargs:
                logger.warning("IterableDataset used with num_workers=%d but no "
                               "worker_init_fn specified: as a result the DataLoader will "
                               "return %d times each element in the dataset",
                               num_workers, num_workers)
        else:
            dataset = self._partition(dataset, options, drop_last, shuffle,
                                      auto_distributed_partitioning, batch_sampler)
            if self._shuffle_blocks:
                shuffle = False  # the blocks are shuffled globally (SubDataset)
        rebatched_size = None
        loader_batch = self._combined_batch_size
        self.rebatched_drop_last = drop_last
        if mode == enums.DataLoaderMode.AsyncRebatched:
            mode = enums.DataLoaderMode.Async
            rebatched_size = self._combined_batch_size
            drop_last = False  # the accessor drops the leftovers
            if rebatched_worker_size is not None:
                if rebatched_worker_size > self._combined_batch_size:
                    raise AssertionError(
                        f"The rebatched_worker_size ({rebatched_worker_size}) must be <= to "
                        f"the combined batch size ({self._combined_batch_size})")
                loader_batch = rebatched_worker_size
        if batch_sampler is not None:
            super().__init__(dataset, batch_sampler=_GroupedBatchSampler(batch_sampler,
                                                                         per_call),
                             num_workers=num_workers, persistent_workers=persistent_workers,
                             **kwargs)
        else:
            super().__init__(dataset, batch_size=loader_batch, shuffle=shuffle,
                             num_workers=num_workers, drop_last=drop_last,
                             persistent_workers=persistent_workers, **kwargs)
        self._accessor = None
        if mode == enums.DataLoaderMode.Async:
            async_options = dict(async_options or {})
            if "rebatched_size" in async_options:
                raise AssertionError("You cannot use DataLoaderMode.AsyncRebatched and "
                                     "manually specify the rebatched_size in async_options")
            self._accessor = AsynchronousDataAccessor(self, **async_options,
                                                      rebatched_size=rebatched_size)
            self._accessor._owned_by(self)

    def _partition(self, dataset, options: Options, drop_last: bool, shuffle: bool,
                   auto: bool, batch_sampler):
        num_elts, procs = len(dataset), options.Distributed.numProcesses
        combined = self._combined_batch_size
        if not drop_last and combined is not None and num_elts % (combined * procs):
            logger.warning(
                "The number of elements in the dataset (%d) is not divisible by the number "
                "of elements processed per step (%d) and drop_last=False. The last tensor "
                "will have a batch size of %d. To avoid having to handle this special case "
                "switch to drop_last=True", num_elts, combined * procs,
                num_elts % (combined * procs))
        if procs <= 1 or not auto:
            return dataset
        if batch_sampler is not None:
            raise createPoptorchError("`batch_sampler` option is mutually exclusive with "
                                      "auto_distributed_partitioning.")
        if shuffle and not options.exists("random_seed"):
            raise AssertionError("When using auto_distributed_partitioning you must set "
                                 "poptorch.Options.randomSeed() to ensure that tensors are "
                                 "in the same order in all processes.")
        if combined is None:
            raise AssertionError("batch_size=None not allowed when using "
                                 "auto_distributed_partitioning.")
        self._shuffle_blocks = shuffle
        return SubDataset(dataset, options, combined, drop_last)

    @property
    def combinedBatchSize(self) -> int | None:
        """Rows of every batch: micro-batch x di x (R/k) x G (None without batching)."""
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        """The (frozen) options it was made with."""
        return self._options

    def terminate(self) -> None:
        """Stop the background worker of an Async loader (nothing otherwise)."""
        if getattr(self, "_accessor", None) is not None:
            self._accessor.terminate()

    def __del__(self) -> None:
        self.terminate()

    def __len__(self) -> int:
        accessor = getattr(self, "_accessor", None)
        if accessor is not None and accessor.rebatched_size:
            num_elts = len(self.dataset)
            length = num_elts // accessor.rebatched_size
            if not self.rebatched_drop_last and num_elts % accessor.rebatched_size:
                length += 1
            return length
        return super().__len__()

    def _sync_iter(self):
        """The batches of one epoch, loaded in the calling thread."""
        if self._shuffle_blocks:
            self.dataset.shuffle()
            self.dataset.swap_range()
        return super().__iter__()

    def __iter__(self):
        if self._accessor is not None:
            return iter(self._accessor)
        return self._sync_iter()
