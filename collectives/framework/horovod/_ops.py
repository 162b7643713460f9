"""Horovod's barrier and join (horovod.torch's semantics); the other collectives are in
:mod:`~collectives.framework.horovod._reduce` (allreduce), :mod:`~collectives.framework.horovod._move`
(allgather, broadcast) and :mod:`~collectives.framework.horovod._exchange` (alltoall,
reducescatter)."""

from __future__ import annotations

import numpy as np

from collectives.framework.horovod import _reduce
from collectives.framework.horovod._call import Call
from collectives.framework.horovod._state import ProcessSet, global_process_set
from collectives.framework.horovod._request import Signature


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return when every rank of the set has called it (a rank that has joined counts, as
    in Horovod). Never earlier: the call's agreement completes only when every member has
    sent its part of it, also after an earlier error of the job (each error leaves every
    member at the same call).

    Raises:
        CollectiveMismatchError: on every rank, when another called something else.
    """
    call = Call(process_set, "barrier")
    with call.lock:
        call.agree(Signature("barrier", {"process_set": process_set.process_set_id}))


def join(device: int = -1) -> int:
    """This rank has no more data (Horovod's ``join``): until every rank has joined, it takes
    part in the other ranks' allreduce calls (contributing zeros; Sum and Average only) and
    barriers. When the others call a collective joined ranks cannot take part in (allgather,
    broadcast, alltoall, reducescatter), or make an argument error or disagree, they raise
    (Horovod's messages, e.g. "Allgather is not supported with Join at this time. ...")
    and this rank goes on waiting. ``device`` is accepted for horovod.torch's signature.

    Returns:
        The rank that joined last (the highest rank among those that joined in the same
        round), the same on every rank.
    """
    call = Call(global_process_set, "join")
    with call.lock:
        position = global_process_set._calls
        while True:
            agreed = call.agree(None, join_pos=position)
            if agreed.all_joined:
                last = max(range(call.size), key=lambda i: (agreed.join_positions[i], i))
                return call.members[last]
            sig = agreed.signature
            if sig.kind == "allreduce":
                zeros = [np.zeros(tuple(shape), np.dtype(d)) for d, shape in sig.tensors]
                _reduce.run(call, sig, zeros)
