"""The engine's accounting hook: the :class:`~collectives._engine.ledger.CallSignature` of a call
signature (the fields of a record fixed by the op, dtype, shape, size and group, and the GCL
method charged), made once per signature; a call's plan adds one entry per call to the
:class:`~collectives._engine.ledger.Ledger` through it, with the bytes its plan sends.
"""

from __future__ import annotations

from collectives._engine.ledger import CallSignature, Ledger
from collectives._engine.descriptor import Descriptor
from collectives.gcl_options import GCLOptions
from collectives.groups import CommGroup


class CallRecorder:
    """Records the calls of one engine.

    Args:
        ledger: where the records go.
        gcl: GCL options (choose the modelled algorithm).
        num_replicas: global replication factor (the groups of a record).
        ipus_per_replica: IPUs each replica occupies (for the cost model).
    """

    def __init__(self, ledger: Ledger, gcl: GCLOptions, num_replicas: int,
                 ipus_per_replica: int):
        self.ledger = ledger
        self.gcl = gcl
        self.num_replicas = num_replicas
        self.ipus_per_replica = ipus_per_replica

    def signature(self, desc: Descriptor, nbytes: int, group: CommGroup | None
                  ) -> CallSignature:
        """The :class:`~collectives._engine.ledger.CallSignature` of ``desc``'s calls with
        ``nbytes`` input bytes per replica (a call's plan makes it once and keeps it)."""
        groups = (group or CommGroup()).members(self.num_replicas)
        method = self.gcl.modelled_method(len(groups[0]), nbytes)
        return self.ledger.signature(desc.op, desc.operator, method, desc.dtype, desc.shape,
                                     nbytes, desc.group, groups, self.ipus_per_replica)
