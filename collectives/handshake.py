"""The descriptor handshake of one collective call between instances.

No instance may use a call's data before it knows that every instance called the same
collective (the descriptors agree); otherwise it raises instead of returning wrong data or
waiting for ever. A handshake can be done two ways:

* **in a round of its own** (:meth:`Handshake.complete`): the instances agree on the
  descriptors first (one MIN/MAX reduction of their fingerprints,
  :meth:`~collectives.transports.base.Communicator.agree`, whole descriptors all-gathered
  only when the fingerprints differ), then the data moves. Every transport does this; it is
  what the MPI and gRPC transports use: O(log P), one small collective.
* **with the call's first data** (:meth:`Handshake.verify`): a transport that can move data
  on speculation may send each descriptor together with the first data of the call, and
  check the descriptors before it waits for (or uses) any data; on a disagreement it
  withdraws what it posted. This saves a round trip between two instances, but costs a
  message between every pair of instances (P(P-1) per call), so no ipupod transport does it
  any more (MPI did until issue 10); the engine keeps the path for a transport that sets
  ``fuses_descriptors``.

The engine makes one :class:`Handshake` per call when its transport says
``fuses_descriptors``, and hands it to the transport on the call's data
:class:`~collectives.waiting.Patience` (``patience.handshake``). A communicator that cannot
carry it calls :meth:`Handshake.complete` before it moves data. After the algorithm, the
engine completes a handshake nobody carried (a call whose groups never left the instance).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from collectives.descriptor import Descriptor
from collectives.waiting import Patience


class Checker(Protocol):
    """What a handshake asks of the engine (:class:`~collectives._engine.CollectiveEngine`)."""

    def exchange_descriptors(self, desc: Descriptor) -> Descriptor:
        """The handshake in a round of its own; raises ``CollectiveMismatchError`` when an
        instance disagrees."""

    def check_descriptors(self, desc: Descriptor, mine: np.ndarray,
                           gathered: np.ndarray) -> None:
        """Compare the gathered descriptors (``uint8[members, WIRE_BYTES]``, member order)
        with ``mine``; raise ``CollectiveMismatchError`` when one differs or carries an
        error."""

    def arrival_patience(self, desc: Descriptor) -> Patience:
        """The wait for the other instances' descriptors (names those not arrived)."""


class Handshake:
    """The pending descriptor check of one call.

    Args:
        desc: this instance's descriptor of the call.
        members: the instances that must agree (all of the job's), increasing.
        call_id: a number of the call, the same on every instance whose descriptors agree
            and different for every call of an engine (transports derive message tags
            from it, so the data of a withdrawn call can never meet a later call).
        checker: the engine, which exchanges, compares and waits (:class:`Checker`).
        payload_bytes: the call's input bytes per replica (the same on every instance
            whose descriptors agree: transports may choose how to carry by it).

    Attributes:
        done: the descriptors were exchanged (and found equal, unless a check raised).
    """

    __slots__ = ("desc", "members", "call_id", "payload_bytes", "done", "_checker", "_mine")

    def __init__(self, desc: Descriptor, members: tuple[int, ...], call_id: int,
                 checker: Checker, payload_bytes: int):
        self.desc = desc
        self.members = members
        self.call_id = call_id
        self.payload_bytes = payload_bytes
        self.done = False
        self._checker = checker
        self._mine: np.ndarray | None = None

    def encoded(self) -> np.ndarray:
        """This instance's descriptor on the wire: ``uint8[WIRE_BYTES]``."""
        if self._mine is None:
            self._mine = self.desc.encode()
        return self._mine

    def patience(self) -> Patience:
        """A new wait for the other instances' descriptors (they may still be computing)."""
        return self._checker.arrival_patience(self.desc)

    def complete(self) -> None:
        """The handshake in a round of its own, unless it is done already.

        Raises:
            CollectiveMismatchError: an instance called something else.
            CollectiveTimeoutError: an instance did not arrive in time.
        """
        if not self.done:
            self.done = True
            self._checker.exchange_descriptors(self.desc)

    def verify(self, gathered: np.ndarray) -> None:
        """Check the descriptors that travelled with the data.

        Args:
            gathered: ``uint8[len(members), WIRE_BYTES]``, every member's descriptor.

        Raises:
            CollectiveMismatchError: an instance called something else; the transport must
                withdraw the call's data requests.
        """
        self.done = True
        self._checker.check_descriptors(self.desc, self.encoded(), gathered)
