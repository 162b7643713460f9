"""Transports: how instances exchange bytes for the collectives.

``Transport``/``Communicator`` (base.py) is the one interface; ``local`` serves a single
instance, ``mpi`` uses mpi4py buffer methods, ``grpc`` streams chunks between peer servers
found through a coordinator. Creators import their libraries lazily, so ``import
collectives`` loads neither mpi4py nor grpc.
"""

from __future__ import annotations

from collectives.transports.base import Communicator, Transport


TRANSPORTS = ("local", "mpi", "grpc")


def create_transport(name: str, process_index: int, process_count: int, *,
                     coordinator_address: str = "", job_token: str = "",
                     listen_address: str = "", options=None) -> Transport:
    """The transport called ``name`` (``"local"``, ``"mpi"`` or ``"grpc"``).

    Args:
        name: which transport.
        process_index, process_count: this instance and the job size.
        coordinator_address, job_token, listen_address: the grpc transport's rendezvous
            (see :class:`~collectives.transports.grpc.GrpcTransport`); ignored by the others.
        options: a :class:`~collectives.options.CollectiveOptions` (timeouts, seconds).

    Raises:
        ValueError: an unknown name.
        TransportError: the transport cannot start (says why).
    """
    if name == "local":
        from collectives.transports.local import LocalTransport
        return LocalTransport(process_index, process_count)
    if name == "mpi":
        try:
            from collectives.transports.mpi import MPITransport
        except ImportError as exc:
            from collectives.errors import TransportError
            raise TransportError(
                f"the MPI transport needs mpi4py (pip install mpi4py mpich): {exc}") from exc
        return MPITransport(process_index, process_count, options=options)
    if name == "grpc":
        try:
            from collectives.transports.grpc import GrpcTransport
        except ImportError as exc:
            from collectives.errors import TransportError
            raise TransportError(f"the grpc transport needs grpcio and protobuf: {exc}") from exc
        return GrpcTransport(process_index, process_count,
                             coordinator_address=coordinator_address, job_token=job_token,
                             listen_address=listen_address, options=options)
    raise ValueError(f"unknown transport {name!r}; known: {', '.join(TRANSPORTS)}")


__all__ = ["Transport", "Communicator", "create_transport"]
