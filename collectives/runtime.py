"""One collective engine per configured IPU system, created on first use."""

from __future__ import annotations

import threading

from ipu_node import get_system
from ipu_node.system import IPUSystem

from collectives.engine import CollectiveEngine
from collectives.errors import CollectiveError
from collectives.options import CollectiveOptions
from collectives.transports import create_transport

_lock = threading.Lock()
_engines: dict[int, CollectiveEngine] = {}


def get_engine(system: IPUSystem | None = None) -> CollectiveEngine:
    """The engine of ``system`` (default: the configured one); starts its transport once.

    A replica failing with anything but a CollectiveError (which every replica raises alike)
    aborts the engine: replicas waiting for the failed one get CollectiveAbortedError.

    Raises:
        ipu_node.NotConfiguredError: no IPU system is configured.
        TransportError: the transport cannot start.
    """
    system = system or get_system()
    with _lock:
        engine = _engines.get(id(system))
        if engine is None:
            options = CollectiveOptions.from_env()
            mrd = system.config.experimental.multi_replica_distribution
            transport = create_transport(system.transport, system.process_index,
                                         system.process_count,
                                         coordinator_address=mrd.coordinator_address,
                                         job_token=mrd.job_token,
                                         listen_address=mrd.listen_address, options=options)
            engine = CollectiveEngine(system.num_replicas, system.num_local_replicas,
                                      system.replica_index_offset, transport, options)
            _engines[id(system)] = engine
            system.add_closer(lambda: _close(system))
            system.executor.add_failure_listener(
                lambda exc: None if isinstance(exc, CollectiveError) else engine.abort(exc))
    return engine


def _close(system: IPUSystem) -> None:
    with _lock:
        engine = _engines.pop(id(system), None)
    if engine is not None:
        engine.transport.close()
