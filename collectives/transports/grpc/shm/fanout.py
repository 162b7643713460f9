"""The fan-out ring: one copy of a broadcast's bytes for every same-host receiver.

Through the pair rings (``channel.py``) a broadcast's root copies its tensor into the
ring of each receiver: P - 1 copies in, P - 1 copies out. With P instances on fewer cores
than P, every copy is on the critical path (P = 4 on 2 cores: the root's three copies of a
1 MiB broadcast are the largest part of the call; figures in the commit). A sender whose
every peer shares its host therefore also has one *fan-out* ring: a memfd like a pair
ring's, handed over to each receiver with its pair ring (a fourth fd on the same
authenticated hand-over: ``SO_PEERCRED``, the job token, the nonce), into which a broadcast
over every instance of the job writes its records once; each receiver reads them with its
own read position, and the sender reuses space once the slowest receiver has released it.
Records have the pair rings' format and checks; the sender wakes each receiver through its
pair ring's eventfd, and a receiver's release wakes a waiting sender through its pair
ring's space eventfd.

Control page of the fan-out ring, as 64-bit words: word 12 the write position and word 16
the sender's "waiting for room" flag (as in a pair ring); receiver instance ``i`` owns word
``32 + 2 i`` (its attached mark) and ``33 + 2 i`` (its read position), so a job of at most
:data:`MAX_FANOUT_INSTANCES` instances can use it (larger ones keep the pair rings). The
ring is used only for communicators of every instance of the job (a broadcast to some of
them would leave the others' positions behind and stall the sender), and only once every
receiver has marked itself attached, so every receiver sees every record from the first.
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import Callable, Sequence

import numpy as np

from collectives.transports.grpc.shm.channel import RingReader
from collectives.transports.grpc.shm.records import (_ATTACHED_MARK, CONTROL_BYTES, RING_BYTES,
                                                SEND_PIECE_BYTES, RecordWriter, _unmap)

logger = logging.getLogger(__name__)

__all__ = ["MAX_FANOUT_INSTANCES", "FanoutReader", "FanoutWriter"]

_FIRST_SLOT_WORD = 32
#: the most instances of a job whose broadcasts go through a fan-out ring (the receivers'
#: words must fit the control page)
MAX_FANOUT_INSTANCES = (CONTROL_BYTES // 8 - _FIRST_SLOT_WORD) // 2


def _words(instance: int) -> tuple[int, int]:
    """(attached mark, read position) words of receiver ``instance``."""
    return _FIRST_SLOT_WORD + 2 * instance, _FIRST_SLOT_WORD + 2 * instance + 1


class FanoutWriter(RecordWriter):
    """The sending end: a memfd ring of ``capacity`` bytes read by every instance in
    ``receivers`` (instance indices, each below :data:`MAX_FANOUT_INSTANCES`). :attr:`fd`
    stays open (each pair ring's hand-over sends it) until :meth:`close`.

    Raises:
        ValueError: a receiver's index is too large for the control page.
        OSError: memfd_create, ftruncate or mmap failed (broadcasts keep the pair rings).
    """

    def __init__(self, receivers: Sequence[int], capacity: int = RING_BYTES):
        if any(not 0 <= r < MAX_FANOUT_INSTANCES for r in receivers):
            raise ValueError(f"fan-out receivers {list(receivers)}: indices must be in "
                             f"[0, {MAX_FANOUT_INSTANCES})")
        self.receivers = tuple(receivers)
        self.fd: int | None = os.memfd_create("ipupod-grpc-fanout", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, CONTROL_BYTES + capacity)
            memory = mmap.mmap(self.fd, CONTROL_BYTES + capacity)
        except BaseException:
            os.close(self.fd)
            raise
        super().__init__(memory, capacity)
        self._read_words = [_words(r)[1] for r in self.receivers]
        self._ready = False

    @classmethod
    def for_job(cls, me: int, host: str, host_ids: Sequence[str]) -> "FanoutWriter | None":
        """Instance ``me``'s fan-out ring when every other instance of the job (at least
        two, at most :data:`MAX_FANOUT_INSTANCES` in all) registered host id ``host``
        (``host_ids``: every instance's); else, or when the memfd cannot be made, None."""
        others = [i for i in range(len(host_ids)) if i != me]
        if not host or not 2 <= len(others) < MAX_FANOUT_INSTANCES \
                or any(host_ids[i] != host for i in others):
            return None
        try:
            return cls(others)
        except OSError as exc:
            logger.info("no fan-out ring (%s): broadcasts use the pair rings", exc)
            return None

    def broadcast(self, me: int, name: bytes, sequence: int, data: np.ndarray,
                  rings: Sequence[RecordWriter], wait: Callable[[], None]) -> np.ndarray:
        """Write ``data`` (uint8) as exchange ``sequence`` of communicator ``name`` from
        instance ``me``, in records of up to :data:`~.records.SEND_PIECE_BYTES`, each
        written once and announced through every receiver's pair ring (``rings``);
        ``wait()`` runs while there is no room (see :meth:`RecordWriter.write_record`).
        Returns ``data`` flattened."""
        data = np.ascontiguousarray(data).reshape(-1)
        at = 0
        while True:
            stop = min(at + SEND_PIECE_BYTES, data.size)
            self.write_record(me, name, sequence, data.size, at, data[at:stop], wait)
            for ring in rings:
                ring.signal()
            at = stop
            if at >= data.size:
                return data

    @property
    def ready(self) -> bool:
        """Every receiver has mapped the ring and marked itself attached."""
        if not self._ready and self._control is not None:
            self._ready = all(int(self._control[_words(r)[0]]) == _ATTACHED_MARK
                              for r in self.receivers)
        return self._ready

    def _read_position(self) -> int:
        """The slowest receiver's read position."""
        control = self._control
        return min(int(control[w]) for w in self._read_words)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        _unmap(self)


class FanoutReader(RingReader):
    """The receiving end of a sender's fan-out ring, as receiver ``instance``: reads records
    like a pair ring (no eventfd of its own: the pair ring's wakes the inbox) and releases
    them in its own word; ``space`` (owned) is the pair ring's space eventfd (a duplicate).
    Use :meth:`make` from a pair ring's :meth:`~RingReader.take_fanout`."""

    @classmethod
    def make(cls, taken: tuple[mmap.mmap, int], instance: int) -> "FanoutReader | None":
        """The reader of the fan-out memory ``taken`` (memory, space eventfd) as receiver
        ``instance``, or None (both closed) when ``instance`` has no words in it."""
        memory, space = taken
        if not 0 <= instance < MAX_FANOUT_INSTANCES:
            memory.close()
            os.close(space)
            return None
        return cls(memory, len(memory) - CONTROL_BYTES, None, space, words=_words(instance))
