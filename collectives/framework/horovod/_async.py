"""horovod.torch's asynchronous calls: here each does its collective at once (every rank
issues them in the same order, so the order of the calls is the order of the work) and
returns a handle; ``synchronize(handle)`` gives the result, ``poll(handle)`` is True."""

from __future__ import annotations

import itertools
import threading

from collectives.framework.horovod._call import Average
from collectives.framework.horovod._compression import Compression
from collectives.framework.horovod._exchange import alltoall, grouped_reducescatter, reducescatter
from collectives.framework.horovod._move import allgather, broadcast, broadcast_, grouped_allgather
from collectives.framework.horovod._reduce import (allreduce, allreduce_, grouped_allreduce,
                                         grouped_allreduce_)
from collectives.framework.horovod._state import global_process_set

_results: dict[int, object] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _handle(result) -> int:
    with _lock:
        handle = next(_ids)
        _results[handle] = result
    return handle


def synchronize(handle: int):
    """The result of the call of ``handle`` (None for a handle already synchronized, as
    horovod.torch)."""
    with _lock:
        return _results.pop(handle, None)


def poll(handle: int) -> bool:
    """True: every call here is complete when it returns."""
    return True


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.allreduce`, as a handle."""
    return _handle(allreduce(tensor, average, name, Compression.none, op, prescale_factor,
                             postscale_factor, process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.allreduce_`, as a handle."""
    return _handle(allreduce_(tensor, average, name, op, prescale_factor, postscale_factor,
                              process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.grouped_allreduce`, as a handle."""
    return _handle(grouped_allreduce(tensors, average, name, Compression.none, op,
                                     prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.grouped_allreduce_`, as a handle."""
    return _handle(grouped_allreduce_(tensors, average, name, op, prescale_factor,
                                      postscale_factor, process_set))


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.allgather`, as a handle."""
    return _handle(allgather(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.grouped_allgather`, as a handle."""
    return _handle(grouped_allgather(tensors, name, process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.broadcast`, as a handle."""
    return _handle(broadcast(tensor, root_rank, name, process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.broadcast_`, as a handle."""
    return _handle(broadcast_(tensor, root_rank, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """:func:`~collectives.framework.horovod.alltoall`, as a handle; its result is always
    ``(received, received_splits)`` (horovod.torch's handle holds both)."""
    if splits is None:
        from collectives.framework.horovod._state import state
        count = len(process_set.ranks) if process_set.ranks else state().size
        rows = tensor.shape[0] if getattr(tensor, "ndim", 0) else 0
        splits = [rows // count] * count if count and rows % count == 0 else None
    return _handle(alltoall(tensor, splits, name, process_set))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> int:
    """:func:`~collectives.framework.horovod.reducescatter`, as a handle."""
    return _handle(reducescatter(tensor, name, Compression.none, op, process_set,
                                 prescale_factor, postscale_factor))


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0) -> int:
    """:func:`~collectives.framework.horovod.grouped_reducescatter`, as a handle."""
    return _handle(grouped_reducescatter(tensors, name, Compression.none, op, process_set,
                                         prescale_factor, postscale_factor))
