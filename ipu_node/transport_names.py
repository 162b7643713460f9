"""The names of the collective transports: the one list that ``IPUConfig``, ``poprun`` and
the transport registry of ``collectives`` read (a leaf module, so that every package may
import it without breaking the import direction of DESIGN.md).

``collectives.transports`` registers one lazily imported creator under each name of
:data:`TRANSPORT_NAMES` (a test checks that the registry and this list agree).
"""

from __future__ import annotations

#: every transport: ``local`` (one instance), ``mpi`` (mpi4py), ``grpc`` (peer servers and a
#: coordinator)
TRANSPORT_NAMES = ("local", "mpi", "grpc")

#: the transports that join several instances: what a launcher (``poprun --transport``) runs
INSTANCE_TRANSPORTS = ("mpi", "grpc")

__all__ = ["TRANSPORT_NAMES", "INSTANCE_TRANSPORTS"]
