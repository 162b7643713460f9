"""One collective engine per configured IPU system, created on first use."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from ipu_node import get_system
from ipu_node.runtime.system import IPUSystem

from collectives.records import CallRecord, OpStats, format_table, total
from collectives.performance.cost_model import HardwareCostModel
from collectives._engine.engine import CollectiveEngine
from collectives._engine.fusion import FusionLimits
from collectives.errors import CollectiveError
from collectives.gcl_options import GCLOptions
from collectives._engine.allocator import keep_freed_memory
from collectives.options import CollectiveOptions
from collectives.performance.run_report import enable_at_exit as enable_report_at_exit
from collectives.transports import create_transport

logger = logging.getLogger("collectives")

_lock = threading.Lock()
_engines: dict[int, CollectiveEngine] = {}


def get_engine(system: IPUSystem | None = None) -> CollectiveEngine:
    """The engine of ``system`` (default: the configured one); starts its transport once.

    A replica failing with anything but a CollectiveError (which every replica raises alike)
    aborts the engine: replicas waiting for the failed one get CollectiveAbortedError.
    At interpreter exit the engine tells the other instances that this one has ended
    (:meth:`CollectiveEngine.finish`). The engine's ledger gets the
    :class:`~collectives.performance.cost_model.HardwareCostModel` of the system's POD and
    layout, so every call records its modelled seconds.

    Raises:
        ipu_node.NotConfiguredError: no IPU system is configured.
        ValueError: bad GCL options (``IPUConfig.gcl_poplar_options`` or ``GCL_OPTIONS``).
        TransportError: the transport cannot start.
    """
    system = system or get_system()
    engine = _engines.get(id(system))  # every collective call comes here: no lock once made
    if engine is not None:
        return engine
    with _lock:
        engine = _engines.get(id(system))
        if engine is None:
            options = CollectiveOptions.for_job(system.process_count)
            if ((system.process_count > 1 or system.num_local_replicas > 1)
                    and options.keep_freed_memory):
                keep_freed_memory()  # large results would page-fault every buffer anew
            mrd = system.config.experimental.multi_replica_distribution
            gcl = GCLOptions.parse(system.config.gcl_poplar_options)
            transport = create_transport(system.transport, system.process_index,
                                         system.process_count,
                                         coordinator_address=mrd.coordinator_address,
                                         job_token=mrd.job_token,
                                         listen_address=mrd.listen_address, options=options)
            opt = system.config.optimizations
            fusion = FusionLimits(opt.maximum_cross_replica_sum_buffer_size,
                                  opt.maximum_reduce_scatter_buffer_size)
            engine = CollectiveEngine(system.num_replicas, system.num_local_replicas,
                                      system.replica_index_offset, transport, options, gcl,
                                      system.ipus_per_replica, fusion)
            engine.ledger.cost_model = _hardware_cost_model(system)
            _engines[id(system)] = engine
            system.add_closer(lambda: _close(system))
            system.executor.add_failure_listener(
                lambda exc: None if isinstance(exc, CollectiveError) else engine.abort(exc))
            if system.process_count > 1:
                atexit.register(_finish, engine)
            enable_report_at_exit(system, engine.ledger)  # if IPUPOD_REPORT_DIR is set
    return engine


def _hardware_cost_model(system: IPUSystem) -> HardwareCostModel | None:
    try:
        return HardwareCostModel.for_system(system)
    except Exception as exc:  # a layout the model cannot place: results still flow
        logger.warning("no modelled time for the collectives of %r: %s", system, exc)
        return None


#: the exit status of an instance whose end of program finds that the job's instances called
#: different collectives (:func:`_finish`)
END_OF_PROGRAM_FAILED = 1


def _finish(engine: CollectiveEngine) -> None:
    """At exit: the engine's end of program (:meth:`CollectiveEngine.finish`). When it finds
    that the instances called different collectives, the program's end is the job's failure:
    the error is logged and the instance exits with :data:`END_OF_PROGRAM_FAILED` at once,
    skipping ``MPI_Finalize`` (which would wait for instances that ended already), so the
    launcher ends the job and every instance's status says it failed."""
    try:
        engine.finish()
    except CollectiveError as exc:
        logger.error("%s", exc)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # (closed by the program)
                pass
        os._exit(END_OF_PROGRAM_FAILED)


def _close(system: IPUSystem) -> None:
    with _lock:
        engine = _engines.pop(id(system), None)
    if engine is not None:
        atexit.unregister(_finish)
        engine.transport.close()


def stats(system: IPUSystem | None = None) -> dict[str, OpStats]:
    """Totals per op of this instance's collective calls on ``system`` (default: the
    configured one): calls, payload bytes (per replica), transport bytes (sent by this
    instance), wall seconds, modelled seconds (from the POD's hardware cost model, or the
    one installed with :func:`collectives.set_cost_model`; None without a model), and the
    GCL methods charged.

    Raises:
        ipu_node.NotConfiguredError: no IPU system is configured.
    """
    return get_engine(system).ledger.totals()


def call_records(system: IPUSystem | None = None) -> list[CallRecord]:
    """This instance's recent collective calls (the last 10000), oldest first."""
    return get_engine(system).ledger.records()


def reset_stats(system: IPUSystem | None = None) -> None:
    """Forget the recorded calls."""
    get_engine(system).ledger.clear()


def total_stats(system: IPUSystem | None = None) -> OpStats:
    """The sum of :func:`stats` over every op (modelled and wall seconds kept apart)."""
    return total(stats(system))


def report(system: IPUSystem | None = None) -> str:
    """This instance's collective calls as a text table, one row per op and a total:
    calls, payload bytes, modelled seconds, wall seconds, modelled GB/s, GCL methods.
    Prints nothing; the program prints or logs it if it wants.

    Raises:
        ipu_node.NotConfiguredError: no IPU system is configured.
    """
    return format_table(stats(system))
