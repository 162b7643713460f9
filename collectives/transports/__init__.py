"""Transports: how instances exchange bytes for the collectives.

``Transport``/``Communicator`` (base.py) is the one interface; ``local`` serves a single
instance, ``mpi`` uses mpi4py buffer methods. Creators import their libraries lazily, so
``import collectives`` loads neither mpi4py nor grpc.
"""

from __future__ import annotations

from collectives.transports.base import Communicator, Transport


def create_transport(name: str, process_index: int, process_count: int) -> Transport:
    """The transport called ``name`` (``"local"`` or ``"mpi"``).

    Raises:
        ValueError: an unknown name.
        TransportError: the transport cannot start (says why).
    """
    if name == "local":
        from collectives.transports.local import LocalTransport
        return LocalTransport(process_index, process_count)
    if name == "mpi":
        from collectives.transports.mpi import MPITransport
        return MPITransport(process_index, process_count)
    raise ValueError(f"unknown transport {name!r}; known: local, mpi")


__all__ = ["Transport", "Communicator", "create_transport"]
