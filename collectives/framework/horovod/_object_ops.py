"""``broadcast_object`` and ``allgather_object`` (horovod.torch's), over the byte
collectives, with the JSON encoding of :mod:`collectives.framework.horovod._objects` (no pickle)."""

from __future__ import annotations

import numpy as np

from collectives.errors import CollectiveMismatchError
from collectives.framework.horovod import _objects
from collectives.framework.horovod._move import allgather, allgather_array, broadcast, broadcast_array
from collectives.framework.horovod._state import ProcessSet, global_process_set, rank


def broadcast_object(obj, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set):
    """``obj`` of rank ``root_rank`` (a global rank, a member of the set) on every rank of
    the set (e.g. ``optimizer.state_dict()``: torch tensors and numpy arrays included).

    Only the root's ``obj`` is encoded (module ``_objects``: JSON with numpy arrays and
    torch tensors; no pickle); the others' is ignored. Two broadcasts: the length, then the
    bytes.

    Raises:
        TypeError: on the root, an object of a type that cannot be sent (then every rank
            raises CollectiveMismatchError: the root announces a length of -1).
    """
    name = name or "broadcast_object"  # (not the type's name: only the root's obj matters)
    data, error = b"", None
    if rank() == root_rank:
        try:
            data = _objects.encode(obj)
        except TypeError as exc:
            error = exc
    length = broadcast(np.array([-1 if error else len(data)], np.int64), root_rank,
                       name=f"{name}.sz", process_set=process_set)
    if error is not None:
        raise error
    if int(length[0]) < 0:
        raise CollectiveMismatchError(f"hvd.broadcast_object: the root rank {root_rank} "
                                      "could not encode its object")
    buf = np.zeros(int(length[0]), np.uint8)
    if data:
        buf[:] = np.frombuffer(data, np.uint8)
    got = broadcast_array(buf, root_rank, f"{name}.t", process_set)
    return _objects.decode(got.tobytes())


def allgather_object(obj, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list:
    """Every rank's ``obj``, as a list in rank order (JSON encoding, see
    :func:`broadcast_object`).

    Raises:
        TypeError: on a rank whose ``obj`` cannot be encoded (the others raise
            CollectiveMismatchError naming it: it announces a length of -1).
    """
    name = name or "allgather_object"
    try:
        data, error = np.frombuffer(_objects.encode(obj), np.uint8), None
    except TypeError as exc:
        data, error = np.zeros(0, np.uint8), exc
    sizes = allgather(np.array([-1 if error else data.size], np.int64), name=f"{name}.sz",
                      process_set=process_set)
    if error is not None:
        raise error
    if (sizes < 0).any():
        bad = [process_set.ranks[i] if process_set.ranks else i
               for i in np.flatnonzero(sizes < 0)]
        raise CollectiveMismatchError(f"hvd.allgather_object: ranks {bad} could not encode "
                                      "their objects")
    raw = allgather_array(data.copy(), f"{name}.t", process_set)
    out, pos = [], 0
    for n in sizes:
        out.append(_objects.decode(raw[pos:pos + int(n)].tobytes()))
        pos += int(n)
    return out
