"""Horovod's allgather and broadcast (horovod.torch's names, positional order and
semantics), on numpy arrays and torch tensors (:mod:`collectives.framework.horovod._tensors`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives.errors import CollectiveArgumentError
from collectives.framework.horovod import _autograd, _data
from collectives.framework.horovod._call import Average, Call, movable
from collectives.framework.horovod._reduce import allreduce, writable
from collectives.framework.horovod._state import ProcessSet, global_process_set, state
from collectives.framework.horovod._tensors import (from_array, is_torch, to_array, torch_module,
                                          write_into)
from collectives.framework.horovod._request import Signature

# -- allgather -------------------------------------------------------------------------


def gather_shape(a: np.ndarray) -> list:
    """The shape ranks compare before a gather: the first dimension may differ (-1), the
    others not; ``[]`` for a 0-d tensor (which no gather takes: refused once agreed)."""
    return [-1, *a.shape[1:]] if a.ndim else []


def refuse_scalars(sig: Signature, kind: str) -> None:
    """Horovod's error for an agreed gather of a 0-d tensor, on every rank.

    Raises:
        CollectiveArgumentError: a tensor of the agreed call has no dimension.
    """
    if any(len(shape) == 0 for _, shape in sig.tensors):
        raise CollectiveArgumentError(f"Process-set rank zero tried to {kind} a rank-zero "
                                      "tensor.")


def _allgather_signature(arrays, ps, name, grouped) -> Signature:
    return Signature("allgather", {"process_set": ps.process_set_id, "name": name,
                                   "grouped": grouped},
                     [(a.dtype.name, gather_shape(a)) for a in arrays])


def _allgather_data(call: Call, arrays: list[np.ndarray], dim0s: np.ndarray) -> list:
    """``dim0s[member, tensor]``: the first dimensions every member brings."""
    out = []
    for t, a in enumerate(arrays):
        row = int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize
        counts = [int(d) * row for d in dim0s[:, t]]
        raw = _data.allgather_bytes(call.engine, call.comm, call.members,
                                    a.reshape(-1).view(np.uint8), counts)
        out.append(np.frombuffer(raw, a.dtype).reshape((int(dim0s[:, t].sum()),) + a.shape[1:])
                   .copy())
    return out


def _gathered(call: Call, arrays: list[np.ndarray], name, grouped: bool) -> list[np.ndarray]:
    sig = _allgather_signature(arrays, call.set, name, grouped)
    with call.lock:
        agreed = call.agree(sig, np.array([a.shape[0] if a.ndim else 0 for a in arrays],
                                          np.int64))
        refuse_scalars(agreed.signature, "ALLGATHER")
        return _allgather_data(call, arrays, agreed.sizes)


def _convert(call: Call, tensors) -> tuple[list, list]:
    pairs = [to_array(t) for t in tensors]
    return [movable(a, call.what) for a, _ in pairs], [like for _, like in pairs]


def grouped_allgather(tensors: Sequence, name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list:
    """Concatenate each tensor over the ranks on dimension 0 (rank order).

    Args:
        tensors: numpy array-likes or torch tensors of rank >= 1, any supported dtype; the
            first dimension may differ between ranks, the others and the dtype may not.

    Returns:
        New tensors of the inputs' types, ``[sum of first dims, *rest]``.

    Raises:
        CollectiveArgumentError: a 0-d tensor (Horovod's "Process-set rank zero tried to
            ALLGATHER a rank-zero tensor.", on every rank); and as
            :func:`~collectives.framework.horovod.grouped_allreduce`.
    """
    call = Call(process_set, "grouped_allgather")
    with call.checking():
        arrays, likes = _convert(call, tensors)
    return [from_array(r, like) for r, like in zip(_gathered(call, arrays, name, True), likes)]


def allgather(tensor, name: str | None = None, process_set: ProcessSet = global_process_set):
    """Concatenate ``tensor`` over the ranks on dimension 0 (rank order); first dimensions
    may differ. A torch tensor that requires a gradient gives a result in the graph (its
    gradient: horovod.torch's, the averaged allreduce of the gradient, this rank's rows).
    See :func:`grouped_allgather`."""
    call = Call(process_set, "allgather")
    with call.checking():
        (arr,), (like,) = _convert(call, [tensor])

    def forward(*_inputs):
        return from_array(_gathered(call, [arr], name, False)[0], like)

    if not _autograd.wants_graph([tensor]):
        return forward()
    dim = arr.shape[0] if arr.ndim else 0

    def backward(grad):
        reduced = allreduce(grad, op=Average, process_set=process_set)
        torch = torch_module()
        dims = allgather(torch.tensor([dim], dtype=torch.int32), process_set=process_set)
        offset = int(dims[:process_set.rank()].sum())
        return (reduced.narrow(0, offset, dim),)

    return _autograd.apply(forward, backward, [tensor])


def allgather_array(arr: np.ndarray, name: str | None, process_set: ProcessSet) -> np.ndarray:
    """:func:`allgather` of a contiguous numpy array of rank >= 1 of any fixed-size dtype
    (uint8 included: the object functions send bytes)."""
    return _gathered(Call(process_set, "allgather"), [arr], name, False)[0]


# -- broadcast -------------------------------------------------------------------------


def _root(root_rank, call: Call) -> int:
    """The member index of ``root_rank``, a global rank (as Horovod's: its process-set tests
    broadcast from each of the set's global ranks).

    Raises:
        ValueError: not a rank of the set (Horovod's "broadcast received invalid root rank").
    """
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) \
            or int(root_rank) not in call.members:
        raise ValueError(f"broadcast received invalid root rank {root_rank!r} for provided "
                         f"process set: hvd.{call.what}'s root_rank is not a rank of the "
                         f"process set (ranks {list(call.members)})")
    return call.members.index(int(root_rank))


def _broadcast(call: Call, arr: np.ndarray, root_rank: int, name) -> np.ndarray:
    root = _root(root_rank, call)
    sig = Signature("broadcast", {"root_rank": int(root_rank),
                                  "process_set": call.set.process_set_id,
                                  "name": name}, [(arr.dtype.name, arr.shape)])
    with call.lock:
        call.agree(sig)
        raw = _data.broadcast_bytes(call.engine, call.comm, call.members,
                                    arr.reshape(-1).view(np.uint8), root)
    return np.frombuffer(raw, arr.dtype).reshape(arr.shape).copy()


def broadcast(tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set):
    """``tensor`` of rank ``root_rank`` on every rank of the set.

    ``root_rank`` is a global rank, a member of ``process_set`` (as in Horovod, whose
    process-set tests broadcast from the set's global ranks). Shapes and dtype must agree on
    every rank. A torch tensor that requires a gradient gives a result in the graph (its
    gradient: horovod.torch's, the averaged allreduce of the gradient, zero off the root).

    Returns:
        A new tensor of the input's type with the root's values (0-d stays 0-d).

    Raises:
        ValueError: ``root_rank`` not a rank of the set (on every rank);
            CollectiveMismatchError on every rank when ranks disagree (shape, dtype, root,
            name).
    """
    call = Call(process_set, "broadcast")
    with call.checking():
        (arr,), (like,) = _convert(call, [tensor])
        _root(root_rank, call)

    def forward(*_inputs):
        return from_array(_broadcast(call, arr, root_rank, name), like)

    if not _autograd.wants_graph([tensor]):
        return forward()

    def backward(grad):
        reduced = allreduce(grad, op=Average, process_set=process_set)
        return (reduced if state().rank == root_rank else reduced * 0,)

    return _autograd.apply(forward, backward, [tensor])


def broadcast_array(arr: np.ndarray, root_rank: int, name: str | None,
                    process_set: ProcessSet) -> np.ndarray:
    """:func:`broadcast` of a contiguous numpy array of any fixed-size dtype."""
    return _broadcast(Call(process_set, "broadcast"), arr, root_rank, name)


def broadcast_(tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set):
    """:func:`broadcast` written into ``tensor`` (a writeable numpy array or a torch tensor,
    outside autograd); returns it.

    Raises:
        TypeError: ``tensor`` is neither (on every rank); and as :func:`broadcast`.
    """
    call = Call(process_set, "broadcast_")
    with call.checking():
        writable(tensor, call.what)
        (arr,), _ = _convert(call, [tensor])
        _root(root_rank, call)
    write_into(tensor, _broadcast(call, arr, root_rank, name))
    return tensor


def broadcast_parameters(params, root_rank: int = 0,
                         process_set: ProcessSet = global_process_set) -> None:
    """Broadcast, in place, parameters from ``root_rank`` (horovod.torch's): a dict
    (``model.state_dict()``, visited in sorted key order, as Horovod), or a list of
    ``(name, tensor)`` pairs (``list(model.named_parameters())``) or of tensors
    (``list(model.parameters())``); numpy arrays or torch tensors. One fused broadcast:
    every tensor's bytes in one buffer (contiguous CPU tensors are read and written in
    place through their numpy views).

    Raises:
        ValueError: ``params`` is neither a dict nor a list (Horovod's "invalid params of
            type"), on this rank.
        TypeError: a value is not a writeable numpy array or a tensor (on every rank).
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    call = Call(process_set, "broadcast_parameters")
    with call.checking():
        for key, p in items:
            writable(p, f"broadcast_parameters ({key!r})")
        arrays = [to_array(_plain(p))[0] for _, p in items]
        flat = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
        _root(root_rank, call)
    if not arrays:
        return
    joined = _broadcast(call, np.concatenate(flat) if len(flat) > 1 else flat[0].copy(),
                        root_rank, "broadcast_parameters")
    pos = 0
    for (_, p), a in zip(items, arrays):
        write_into(p, np.frombuffer(joined[pos:pos + a.nbytes], a.dtype).reshape(a.shape))
        pos += a.nbytes


def _plain(p):
    return p.detach() if is_torch(p) else p
