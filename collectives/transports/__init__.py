"""Transports: how instances exchange bytes for the collectives.

``Transport``/``Communicator`` (base.py) is the one interface; ``local`` serves a single
instance, ``mpi`` uses mpi4py buffer methods, ``grpc`` streams chunks between peer servers
found through a coordinator. Each is found by name through the registry (registry.py); the
creators below import their libraries when called, so ``import collectives`` loads neither
mpi4py nor grpc.
"""

from __future__ import annotations

from collectives.errors import TransportError
from collectives.transports.base import Communicator, Transport
from collectives.transports.registry import (create_transport, register_transport,
                                             registered_transports)


def _local(process_index: int, process_count: int, **_) -> Transport:
    from collectives.transports.local.transport import LocalTransport
    return LocalTransport(process_index, process_count)


def _mpi(process_index: int, process_count: int, *, options=None, **_) -> Transport:
    try:
        from collectives.transports.mpi.transport import MPITransport
    except ImportError as exc:
        raise TransportError(
            f"the MPI transport needs mpi4py (pip install mpi4py mpich): {exc}") from exc
    return MPITransport(process_index, process_count, options=options)


def _grpc(process_index: int, process_count: int, *, coordinator_address: str,
          job_token: str, listen_address: str, options) -> Transport:
    try:
        from collectives.transports.grpc.transport import GrpcTransport
    except ImportError as exc:
        raise TransportError(f"the grpc transport needs grpcio and protobuf: {exc}") from exc
    return GrpcTransport(process_index, process_count, coordinator_address=coordinator_address,
                         job_token=job_token, listen_address=listen_address, options=options)


register_transport("local", _local)
register_transport("mpi", _mpi)
register_transport("grpc", _grpc)

__all__ = ["Transport", "Communicator", "create_transport", "register_transport",
           "registered_transports"]
