"""The engine's accounting hooks: what one call sent and took goes into the ledger.

:class:`CallRecorder` counts the bytes the engine's communicators send during a call
(:meth:`CallRecorder.bytes_sent`, read before and after) and adds one entry per call to the
:class:`~collectives._accounting.Ledger`, through a
:class:`~collectives._accounting.CallSignature` made once per call signature (the fields of a
record fixed by the op, dtype, shape, size and group, and the GCL method charged).
"""

from __future__ import annotations

from ipu_node.clock import charge_collective

from collectives._accounting import CallSignature, CountingCommunicator, Ledger
from collectives.descriptor import Descriptor
from collectives.gcl_options import GCLOptions
from collectives.groups import CommGroup

#: signatures a recorder keeps before it starts again (a program calls few distinct ones)
_MAX_SIGNATURES = 4096


class CallRecorder:
    """Records the calls of one engine.

    Args:
        ledger: where the records go.
        gcl: GCL options (choose the modelled algorithm).
        num_replicas: global replication factor (the groups of a record).
        ipus_per_replica: IPUs each replica occupies (for the cost model).
        communicators: the engine's communicators by instance set (a live view: those
            created later count too).
    """

    def __init__(self, ledger: Ledger, gcl: GCLOptions, num_replicas: int,
                 ipus_per_replica: int, communicators: dict[tuple[int, ...],
                                                          CountingCommunicator]):
        self.ledger = ledger
        self.gcl = gcl
        self.num_replicas = num_replicas
        self.ipus_per_replica = ipus_per_replica
        self._comms = communicators.values()
        self._signatures: dict = {}  # call signature -> CallSignature

    def bytes_sent(self) -> int:
        """Bytes the engine's communicators have sent so far (to other instances)."""
        return sum(c.bytes_sent for c in self._comms)

    def record(self, desc: Descriptor, nbytes: int, group: CommGroup | None, sent: int,
               wall_s: float) -> None:
        """One call of ``desc``: ``nbytes`` input bytes per replica, ``sent`` bytes sent by
        this instance, ``wall_s`` wall seconds."""
        self.record_signed(self.signature(desc, nbytes, group), sent, wall_s,
                           None if desc.op.startswith("host ") else desc.op)

    def signature(self, desc: Descriptor, nbytes: int, group: CommGroup | None
                  ) -> CallSignature:
        """The :class:`~collectives._accounting.CallSignature` of ``desc``'s calls with
        ``nbytes`` input bytes per replica (made once per signature: the engine keeps it
        for a call signature's later calls)."""
        key = (desc.op, desc.operator, desc.dtype, desc.shape, desc.group, nbytes)
        signature = self._signatures.get(key)
        if signature is None:
            groups = (group or CommGroup()).members(self.num_replicas)
            method = self.gcl.modelled_method(len(groups[0]), nbytes)
            if len(self._signatures) >= _MAX_SIGNATURES:
                self._signatures.clear()
            signature = self._signatures[key] = self.ledger.signature(
                desc.op, desc.operator, method, desc.dtype, desc.shape, nbytes, desc.group,
                groups, self.ipus_per_replica)
        return signature

    def record_signed(self, signature: CallSignature, sent: int, wall_s: float,
                      charge: str | None) -> None:
        """One call of ``signature``; ``charge``: the label of the modelled clocks' event
        (None: a host call, which no replica waits in)."""
        modelled = self.ledger.add_signed(signature, sent, wall_s)
        if modelled is not None and charge is not None:
            # every local replica waits in this call: their IPUs' modelled clocks pay it
            charge_collective(modelled, charge)
