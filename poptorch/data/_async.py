"""``poptorch.AsynchronousDataAccessor``: data loaded in the background while the model runs
(poptorch reference §4.4).

ipupod's worker is a **thread** feeding a bounded queue of ``buffer_size`` batches
(PopTorch's is a process writing a shared-memory ring). A thread because the heavy work is
not Python: a ``DataLoader`` with ``num_workers > 0`` already loads in worker processes
(started by the thread), and collation and tensor ops release the GIL; a thread needs no
pickling of the data set (``sharing_strategy`` is accepted and has no effect) and no
shared-memory ring. The batches it yields are the loader's own tensors: unlike PopTorch's,
they are not recycled by the next ``next()``, so keeping one without ``.clone()`` is safe.

One epoch of the data set is one iteration (``StopIteration`` at its end); with
``load_indefinitely`` the worker goes on loading the next epoch meanwhile. ``iter()`` in the
middle of an epoch starts a new one from the beginning.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any, Callable

import torch

from poptorch import enums
from poptorch._errors import createPoptorchError
from poptorch._nest import flatten

__all__ = ["AsynchronousDataAccessor"]

_EPOCH_END = object()
#: seconds between checks of the stop flag while the queue is full or empty
_POLL_S = 0.05


class _Failure:
    def __init__(self, exc: BaseException, started: bool):
        self.exc, self.started = exc, started


def _concat(batches: list) -> Any:
    leaves = [flatten(b)[0] for b in batches]
    rebuild = flatten(batches[0])[1]
    return rebuild([torch.cat([leaf[i] for leaf in leaves]) for i in range(len(leaves[0]))])


def _rows(batch: Any) -> int:
    return len(flatten(batch)[0][0])


def _split(batch: Any, at: int) -> tuple[Any, Any]:
    leaves, rebuild = flatten(batch)
    return rebuild([x[:at] for x in leaves]), rebuild([x[at:] for x in leaves])


class _Source:
    """How an accessor and its worker reach the data set: ``get()`` gives it, or None once
    a DataLoader that owns the accessor is gone (:meth:`AsynchronousDataAccessor._owned_by`
    replaces a strong reference by a weak one, also for a worker already started)."""

    def __init__(self, get: Callable[[], Any]):
        self.get = get


class _Worker(threading.Thread):
    """Loads epochs of ``source.get()`` (the data set, or None once it is gone) into ``out``
    until stopped. It holds the data set only while it starts an epoch: the iterator of an
    epoch is its own, and is dropped (its worker processes shut down) when the thread ends."""

    def __init__(self, source: "_Source", out: queue.Queue, load_indefinitely: bool,
                 rebatched_size: int | None, drop_last: bool):
        super().__init__(name="poptorch-async-loader", daemon=True)
        self.source, self.out = source, out
        self.load_indefinitely = load_indefinitely
        self.rebatched_size, self.drop_last = rebatched_size, drop_last
        self.stop = threading.Event()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.out.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _open(self):
        """The iterator of the next epoch, or None when the DataLoader is gone."""
        source = self.source.get()
        if source is None:  # the DataLoader that owned this accessor is gone
            return None
        return source._sync_iter() if hasattr(source, "_sync_iter") else iter(source)

    def _epoch(self, it):
        if not self.rebatched_size:
            yield from it
            return
        pending: list = []
        rows = 0
        for batch in it:
            pending.append(batch)
            rows += _rows(batch)
            while rows >= self.rebatched_size:
                whole = _concat(pending)
                head, tail = _split(whole, self.rebatched_size)
                yield head
                rows -= self.rebatched_size
                pending = [tail] if rows else []
        if rows and not self.drop_last:
            yield _concat(pending)

    def run(self) -> None:
        started = False
        try:
            while not self.stop.is_set():
                empty = True
                it = self._open()
                if it is None:
                    return
                for item in self._epoch(it):
                    empty = False
                    started = True
                    if not self._put(item):
                        return
                del it
                if empty and not started:
                    raise createPoptorchError("The Dataset is empty")
                if not self._put(_EPOCH_END) or not self.load_indefinitely:
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Failure(exc, started))


class AsynchronousDataAccessor:
    """Iterate ``dataset`` with the loading done by a background thread.

    Args:
        dataset: a ``poptorch.DataLoader`` (Sync mode) or any iterable.
        buffer_size: batches loaded ahead (>= 1).
        miss_sleep_time_in_ms: PopTorch's worker back-off; accepted, no effect (the queue
            wakes the consumer).
        load_indefinitely: go on loading the next epoch while the current one is consumed.
        early_preload: start loading now rather than at the first ``iter()``.
        sharing_strategy: accepted, no effect (a thread shares the data set object).
        rebatched_size: yield batches of exactly this many rows, concatenating and cutting
            the loader's (None: as they come; else > 1).

    Raises:
        poptorch.Error: ``dataset`` is a DataLoader that already has an accessor; later, a
            data set that fails in the worker ("... worker thread failed to start: ..."
            when no batch was loaded yet), or an empty one ("The Dataset is empty").
        AssertionError: ``rebatched_size`` 1 or less.
    """

    def __init__(self, dataset, buffer_size: int = 3, miss_sleep_time_in_ms: float = 0.1,
                 load_indefinitely: bool = True, early_preload: bool = False,
                 sharing_strategy: enums.SharingStrategy = enums.SharingStrategy.ForkServer,
                 rebatched_size: int | None = None):
        self._worker = None
        if getattr(dataset, "_accessor", None) is not None:
            raise createPoptorchError(
                "The DataLoader already uses an AsynchronousDataAccessor internally. Either "
                "use the existing one or set mode='poptorch.DataLoaderMode.Sync' in the "
                "DataLoader.")
        if rebatched_size is not None and rebatched_size <= 1:
            raise AssertionError("rebatched_size must be None or greater than 1")
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be an int >= 1, got {buffer_size!r}")
        self._source = _Source(lambda: dataset)
        self.rebatched_size = rebatched_size
        self._buffer_size = buffer_size
        self._load_indefinitely = load_indefinitely
        self._drop_last = getattr(dataset, "rebatched_drop_last", True)
        self._in_epoch = False
        self._queue: queue.Queue | None = None
        ref = weakref.ref(self)
        self._atexit = lambda: ref() is not None and ref().terminate()
        atexit.register(self._atexit)
        if early_preload:
            self._start()

    @property
    def _dataset(self):
        return self._source.get()

    def _owned_by(self, loader) -> None:
        """This accessor is ``loader``'s own (``DataLoaderMode.Async``): it refers to it
        weakly, so that a loader that is dropped (no reference cycle between the two) stops
        the worker thread, which lets its epoch's iterator and worker processes go at once
        rather than at a later garbage collection (which may run inside the next loader's
        forked workers: "can only test a child process")."""
        self._source.get = weakref.ref(loader)

    def _start(self) -> None:
        self._queue = queue.Queue(maxsize=self._buffer_size)
        self._worker = _Worker(self._source, self._queue, self._load_indefinitely,
                               self.rebatched_size, self._drop_last)
        self._worker.start()

    def terminate(self) -> None:
        """Stop the worker thread (it ends within its next put or load)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop.set()
            if worker is not threading.current_thread():  # (the last reference may go there)
                worker.join(timeout=10.0)
        self._in_epoch = False

    def __del__(self) -> None:
        try:
            self.terminate()
            atexit.unregister(self._atexit)
        except Exception:  # interpreter shutdown
            pass

    def __len__(self) -> int:
        length = len(self._dataset)
        if self.rebatched_size and getattr(self._dataset, "_accessor", None) is not self:
            return length * getattr(self._dataset, "batch_size", 1) // self.rebatched_size
        return length

    def __iter__(self) -> "_Epoch":
        """An iterator over the next epoch (a new one from the start when an epoch was
        under way)."""
        worker = self._worker
        if worker is None or self._in_epoch or not worker.is_alive() and \
                self._queue.empty():
            self.terminate()
            self._start()
        self._in_epoch = True
        return _Epoch(self, self._dataset)

    def _next(self) -> Any:
        if self._worker is None or not self._in_epoch:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._worker.is_alive() and self._queue.empty():
                    self._in_epoch = False
                    raise StopIteration from None
        if item is _EPOCH_END:
            self._in_epoch = False
            raise StopIteration
        if isinstance(item, _Failure):
            self._in_epoch = False
            self.terminate()
            if not item.started and isinstance(item.exc, Exception) and \
                    getattr(item.exc, "message", "") == "The Dataset is empty":
                raise item.exc
            what = "failed to start" if not item.started else "failed"
            raise createPoptorchError(f"AsynchronousDataAccessor worker thread {what}: "
                                      f"{type(item.exc).__name__}: {item.exc}") from item.exc
        return item


class _Epoch:
    """The iterator of one epoch of an :class:`AsynchronousDataAccessor`; it keeps the data
    set (the DataLoader) alive while it is iterated (``for x in poptorch.DataLoader(...)``
    holds only the iterator)."""

    def __init__(self, accessor: AsynchronousDataAccessor, dataset: Any):
        self._accessor, self._dataset = accessor, dataset

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        return self._accessor._next()
