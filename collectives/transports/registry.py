"""The transport registry: name -> creator, the one place a transport is found by name.

A creator is a small function that imports its transport's module when called (so ``import
collectives`` loads neither mpi4py nor grpc) and builds it from the common arguments of
:func:`create_transport`. The names are :data:`ipu_node.transport_names.TRANSPORT_NAMES`
(which ``IPUConfig`` and ``poprun`` read too); :mod:`collectives.transports` registers the
creators of ipupod's transports under them.
"""

from __future__ import annotations

from typing import Callable

from collectives.transports.base import Transport

#: ``creator(process_index, process_count, *, coordinator_address, job_token,
#: listen_address, options) -> Transport``
Creator = Callable[..., Transport]

_creators: dict[str, Creator] = {}


def register_transport(name: str, creator: Creator) -> None:
    """Make ``create_transport(name, ...)`` call ``creator``.

    Raises:
        ValueError: ``name`` is registered already.
    """
    if name in _creators:
        raise ValueError(f"transport {name!r} is registered already")
    _creators[name] = creator


def registered_transports() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(_creators)


def create_transport(name: str, process_index: int, process_count: int, *,
                     coordinator_address: str = "", job_token: str = "",
                     listen_address: str = "", options=None) -> Transport:
    """The transport called ``name`` (see :func:`registered_transports`).

    Args:
        name: which transport.
        process_index, process_count: this instance and the job size.
        coordinator_address, job_token, listen_address: the grpc transport's rendezvous
            (see :class:`~collectives.transports.grpc.transport.GrpcTransport`); ignored by the others.
        options: a :class:`~collectives.options.CollectiveOptions` (timeouts, seconds).

    Raises:
        ValueError: an unknown name.
        TransportError: the transport cannot start (says why).
    """
    creator = _creators.get(name)
    if creator is None:
        raise ValueError(f"unknown transport {name!r}; known: {', '.join(_creators)}")
    return creator(process_index, process_count, coordinator_address=coordinator_address,
                   job_token=job_token, listen_address=listen_address, options=options)
