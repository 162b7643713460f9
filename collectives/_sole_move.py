"""The large data-movement calls of an instance with one replica, prepared once per signature.

On an instance with one local replica (the common case under MPI), ``all_gather``,
``all_to_all`` along dimension 0 and ``broadcast`` move their bytes straight between the
caller's input, the other instances and a fresh result, as the classes here do (for
:mod:`collectives._movement`'s ``_*_sole`` functions too, which make one at each call). A
call too large to travel in its agreement (:mod:`collectives._eager`) moves them after it.
:class:`~collectives._sole.SolePlan` runs such calls through the signature's
:class:`SoleMove`, made at its first call with what the signature fixes: the group's
counting communicator, the byte counts, the result's shape and dtype, the root, and the
data wait's :class:`~collectives.waiting.Patience` (restarted at every call instead of made
anew, its text naming the call's number). A call then only allocates its result and makes
the communicator's call, without the general path's per-call look-ups (the route, the
descriptor of the call's number, the patience, the nest of functions).

Measured on the 2-core VM, 2 instances, 1 MiB, ``benchmarks/collectives.py`` (raw time /
ours, the raw call into a fresh result; 3 runs each, the previous path and this one run in
turn): all_gather 0.63-0.67 -> 0.69-0.70, all_to_all 0.58-0.60 -> 0.63-0.64, broadcast
0.88 -> 0.96-0.97. From 3 instances, calls whose result reaches
``collectives._eager.EARLY_MIN_BYTES`` are posted before their agreement instead
(:mod:`collectives.transports.mpi_early`), where the transport does so.
"""

from __future__ import annotations

import numpy as np

from collectives._routing import sole_route
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup

__all__ = ["SoleMove", "SoleGatherMove", "SoleAllToAllMove", "SoleBroadcastMove"]


class _CallText:
    """The text of a call's data wait, ``"all_gather #7"``, made when first shown (most
    waits end without one); ``seq``: the call's number (set at every call)."""

    __slots__ = ("_desc", "seq")

    def __init__(self, desc: Descriptor):
        self._desc, self.seq = desc, desc.seq

    def __str__(self) -> str:
        desc = self._desc
        return (desc if desc.seq == self.seq else desc.with_seq(self.seq)).label()

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class SoleMove:
    """Every large call of one signature on an instance with one replica (module
    docstring); None of :meth:`make` where the group has one member (no communicator).

    Args:
        engine: the :class:`~collectives._engine.CollectiveEngine` (one local replica).
        desc: the signature's descriptor (``seq`` 0).
        value: the first call's input (``ndarray``; every call of the signature has its
            dtype and shape).
        comm: the group's counting communicator; instances: its members' instances;
            members: the group's replicas in position order (for the subclasses).
    """

    __slots__ = ("_comm", "_text", "_patience", "_dtype", "_shape")

    def __init__(self, engine, desc: Descriptor, value: np.ndarray, comm, instances,
                 members):
        self._comm = comm
        self._text = _CallText(desc)
        self._patience = engine.data_patience(desc, instances, self._text)
        self._dtype = value.dtype
        self._shape = value.shape

    @classmethod
    def make(cls, engine, desc: Descriptor, value: np.ndarray, group: CommGroup, *args):
        """The signature's move, or None for a group of one member."""
        members, instances, comm = sole_route(engine, group)
        if comm is None:
            return None
        return cls(engine, desc, value, comm, instances, members, *args)

    def __call__(self, value: np.ndarray, seq: int) -> tuple[np.ndarray, int]:
        """Call number ``seq`` of the signature, after its agreement: ``(result, bytes
        sent)``, the result a new array, the bytes as the counting communicator counts them
        (read from it: cheaper than the recorder's sum over every communicator).

        Raises:
            CollectiveTimeoutError, TransportError, PeerLostError: as the communicator's
                call (the caller aborts the engine).
        """
        self._text.seq = seq
        patience = self._patience
        patience.restart()
        comm = self._comm
        before = comm.bytes_sent
        result = self._move(value, patience)
        return result, comm.bytes_sent - before

    def _move(self, value: np.ndarray, patience) -> np.ndarray:
        raise NotImplementedError


def _flat(value: np.ndarray) -> np.ndarray:
    """``value``'s bytes in memory order (``uint8``; a copy only if not contiguous)."""
    return np.ascontiguousarray(value).reshape(-1).view(np.uint8)


class SoleGatherMove(SoleMove):
    """``all_gather``: ``[k, *shape]``, the members' values in position order (each member
    on its own instance, in order: the gathered bytes are the result)."""

    __slots__ = ("_out_shape", "_counts")

    def __init__(self, engine, desc, value, comm, instances, members):
        super().__init__(engine, desc, value, comm, instances, members)
        self._out_shape = (len(members), *value.shape)
        self._counts = [value.nbytes] * len(members)

    def _move(self, value, patience):
        out = np.empty(self._out_shape, self._dtype)
        flat = out.reshape(-1).view(np.uint8)
        got = self._comm.allgatherv_to(_flat(value), flat, self._counts, patience)
        return out if got is flat else got.view(self._dtype).reshape(self._out_shape)


class SoleAllToAllMove(SoleMove):
    """``all_to_all`` along dimension 0: the value in memory order is its blocks in
    destination order, and the blocks arrive in sender order, already concatenated."""

    __slots__ = ()

    def _move(self, value, patience):
        out = np.empty(self._shape, self._dtype)
        flat = out.reshape(-1).view(np.uint8)
        got = self._comm.alltoall_to(_flat(value), flat, patience)
        return out if got is flat else got.view(self._dtype).reshape(self._shape)


class SoleBroadcastMove(SoleMove):
    """``broadcast`` from position ``root``: the root copies its value into its result
    while the others receive theirs straight into theirs."""

    __slots__ = ("_root", "_is_root")

    def __init__(self, engine, desc, value, comm, instances, members, root: int):
        super().__init__(engine, desc, value, comm, instances, members)
        self._root = root
        self._is_root = members[root] == engine.replica_index_offset

    def _move(self, value, patience):
        if self._is_root:
            send = _flat(value)
            result: list = []
            patience.overlap(lambda: result.append(send.copy()))  # while the peers receive
            self._comm.broadcast(send, self._root, patience)
            patience.settle()
            return result[0].view(self._dtype).reshape(self._shape)
        data = self._comm.broadcast(np.empty(value.nbytes, np.uint8), self._root, patience)
        return data.view(self._dtype).reshape(self._shape)
