"""Horovod's API on numpy arrays: ``import collectives.horovod as hvd``.

horovod.torch's names, signatures and semantics, with numpy arrays in place of tensors
(seed 004:2069-2187 for the TF-IPU subset; Horovod's own docs and ``horovod/common`` where
the seeds are silent). One Horovod process per ipupod instance; collectives go over the
configured IPU system's transport (MPI, gRPC or local), so programs run under plain
``mpirun -n N python prog.py``, ``poprun -n N`` and ``python -m launch.multiworker``.

Where ipupod differs from Horovod, on purpose:

* Ranks that disagree (shape, ndim, dtype, op, scale factors, root, name, number of
  tensors, kind of collective) raise ``CollectiveMismatchError`` on every rank of the
  process set instead of waiting for ever; the next call works. A rank calling on a
  process set it is not in raises ValueError at once (as Horovod); ranks calling on
  different process sets wait for each other and time out (``CollectiveTimeoutError``
  naming the missing ranks) after ``IPUPOD_COLLECTIVE_TIMEOUT_S``.
* ``broadcast_object``/``allgather_object`` encode objects as JSON with numpy support, not
  cloudpickle (see :mod:`collectives.horovod._objects` for the types allowed).
* Calls are synchronous (no handles); ``join`` serves allreduce (Sum/Average), allgather
  and barrier of the other ranks.
"""

from __future__ import annotations

import numpy as np

from collectives.horovod import _objects
from collectives.horovod._ops import allgather_array, broadcast_array
from collectives.horovod._exchange import alltoall, grouped_reducescatter, reducescatter
from collectives.horovod._ops import (Adasum, Average, Max, Min, Product, Sum, allgather,
                                      allreduce, allreduce_, barrier, broadcast, broadcast_,
                                      broadcast_parameters, grouped_allgather,
                                      grouped_allreduce, grouped_allreduce_, join)
from collectives.horovod._state import (HorovodNotInitializedError, ProcessSet,
                                        add_process_set, cross_rank, cross_size,
                                        global_process_set, init, is_initialized, local_rank,
                                        local_size, rank, remove_process_set, shutdown, size)


def broadcast_object(obj, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set):
    """``obj`` of rank ``root_rank`` (a global rank, a member of the set) on every rank of
    the set.

    Only the root's ``obj`` is encoded (module ``_objects``: JSON with numpy arrays; no
    pickle); the others' is ignored. Two broadcasts: the length, then the bytes.

    Raises:
        TypeError: on the root, an object of a type that cannot be sent (then every rank
            raises CollectiveMismatchError: the root announces a length of -1).
    """
    name = name or "broadcast_object"
    data, error = b"", None
    if rank() == root_rank:
        try:
            data = _objects.encode(obj)
        except TypeError as exc:
            error = exc
    length = broadcast(np.array([-1 if error else len(data)], np.int64), root_rank,
                       name=f"{name}.size", process_set=process_set)
    if error is not None:
        raise error
    if int(length[0]) < 0:
        from collectives.errors import CollectiveMismatchError
        raise CollectiveMismatchError(f"hvd.broadcast_object: the root rank {root_rank} "
                                      "could not encode its object")
    buf = np.zeros(int(length[0]), np.uint8)
    if data:
        buf[:] = np.frombuffer(data, np.uint8)
    got = broadcast_array(buf, root_rank, f"{name}.data", process_set)
    return _objects.decode(got.tobytes())


def allgather_object(obj, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list:
    """Every rank's ``obj``, as a list in rank order (JSON encoding, see
    :func:`broadcast_object`).

    Raises:
        TypeError: ``obj`` cannot be encoded (raised before any exchange, on this rank).
    """
    data = np.frombuffer(_objects.encode(obj), np.uint8)
    sizes = allgather(np.array([data.size], np.int64), name=f"{name or 'allgather_object'}"
                      ".size", process_set=process_set)
    raw = allgather_array(data.copy(), f"{name or 'allgather_object'}.data", process_set)
    out, pos = [], 0
    for n in sizes:
        out.append(_objects.decode(raw[pos:pos + int(n)].tobytes()))
        pos += int(n)
    return out


def rank_in_set(process_set: ProcessSet) -> int:
    """This rank's position in ``process_set`` (its ``rank()``)."""
    return process_set.rank()


__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "Sum", "Average", "Min", "Max", "Product", "Adasum",
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "allgather",
    "grouped_allgather", "broadcast", "broadcast_", "broadcast_parameters",
    "broadcast_object", "allgather_object", "alltoall", "reducescatter",
    "grouped_reducescatter", "join", "barrier", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "HorovodNotInitializedError",
]
