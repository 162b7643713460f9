"""Replica contexts and the executor that runs one thread per local replica."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ipu_node.errors import IPUFloatingPointError, NotInReplicaError, WiderReplicasNeeded
from ipu_node.runtime.device import IPU

logger = logging.getLogger("ipu_node.replica")  # (fixed: programs set loggers by name)

_current = threading.local()


@dataclass(frozen=True)
class ReplicaContext:
    """Where a replica function runs.

    Attributes:
        replica_index: global replica index, in ``[0, num_replicas)``.
        local_index: index among this instance's replicas, in ``[0, num_local_replicas)``.
        num_replicas: global replication factor.
        num_local_replicas: replicas of this instance.
        ipus: the IPUs this replica occupies (``ipus_per_replica`` of them).
    """

    replica_index: int
    local_index: int
    num_replicas: int
    num_local_replicas: int
    ipus: tuple[IPU, ...]


def current_replica_context() -> ReplicaContext | None:
    """The context of the replica running in this thread, or None outside replica functions."""
    return getattr(_current, "ctx", None)


@contextlib.contextmanager
def entered_replica_context(ctx: ReplicaContext):
    """Run the body as replica ``ctx`` in this thread (a front end whose framework runs a
    replica's operations on threads of its own, as TensorFlow runs a ``numpy_function`` on its
    inter-op threads, enters the replica's context there); the thread's previous context comes
    back after."""
    previous = getattr(_current, "ctx", None)
    _current.ctx = ctx
    try:
        yield ctx
    finally:
        _current.ctx = previous


def require_replica_context(what: str) -> ReplicaContext:
    """The current replica context; raises :class:`NotInReplicaError` naming ``what`` outside one."""
    ctx = current_replica_context()
    if ctx is None:
        raise NotInReplicaError(
            f"{what} must be called inside a replica function "
            "(the function passed to strategy.run)")
    return ctx


class ReplicaExecutor:
    """Runs a function once per local replica, concurrently, each in its own thread.

    With one local replica the function runs in the caller's thread (no hand-off).

    Args:
        contexts: one per local replica.
        errstate: ``numpy.errstate`` keywords in force inside the replica functions
            (``IPUConfig.floating_point_behaviour``); a floating-point event they make raise
            comes out as :class:`~ipu_node.errors.IPUFloatingPointError` naming the option.
    """

    def __init__(self, contexts: Sequence[ReplicaContext], errstate: dict | None = None):
        self._contexts = tuple(contexts)
        self._errstate = dict(errstate or {})
        self._pool = (ThreadPoolExecutor(len(contexts), thread_name_prefix="ipu-replica")
                      if len(contexts) > 1 else None)
        self._failure_listeners: list[Callable[[BaseException], None]] = []
        self._running = threading.Lock()
        self._blas = None  # threadpoolctl's controller, made on the first run
        self._error_lock = threading.Lock()
        self._first_error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._running.locked()

    def add_failure_listener(self, listener: Callable[[BaseException], None]) -> None:
        """Call ``listener(exc)`` as soon as a replica raises (to wake replicas that wait on it)."""
        self._failure_listeners.append(listener)

    def run(self, fn: Callable[..., Any], args: Sequence[tuple], kwargs: Sequence[dict]) -> list:
        """Call ``fn(*args[i], **kwargs[i])`` for local replica i; results in local order.

        Raises:
            The first exception any replica raised (in time order); the others are logged.
        """
        if not self._running.acquire(blocking=False):
            raise RuntimeError("strategy.run is already running; it cannot be nested")
        try:
            if self._pool is None:
                return [self._call(self._contexts[0], fn, args[0], kwargs[0])]
            self._first_error = None
            with self._blas_threads_per_replica():
                futures = [self._pool.submit(self._call, ctx, fn, a, k)
                           for ctx, a, k in zip(self._contexts, args, kwargs)]
                wait(futures)
            if self._first_error is not None:
                raise self._first_error
            return [f.result() for f in futures]
        finally:
            self._running.release()

    def _blas_threads_per_replica(self):
        """While several replicas run at once, each gets cores / replicas BLAS threads (at
        least one): a BLAS spreading every matmul over all cores from every replica thread
        oversubscribes the machine (measured: 4 replicas of a 4096x1024 MLP step took 1.6x
        plain numpy's time, 0.6x with one BLAS thread each). Numbers of threads come back
        when the replicas are done."""
        if self._blas is None:
            try:
                from threadpoolctl import ThreadpoolController
                self._blas = ThreadpoolController()  # scanning the libraries once: ~0.25 ms
            except ImportError:
                self._blas = False
        if not self._blas:
            return contextlib.nullcontext()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
        return self._blas.limit(limits=max(1, cores // len(self._contexts)), user_api="blas")

    def _call(self, ctx: ReplicaContext, fn, args, kwargs):
        _current.ctx = ctx
        try:
            if not self._errstate:
                return fn(*args, **kwargs)
            try:
                with np.errstate(**self._errstate):
                    return fn(*args, **kwargs)
            except FloatingPointError as exc:
                if isinstance(exc, IPUFloatingPointError):
                    raise
                raise IPUFloatingPointError(
                    f"floating-point exception on replica {ctx.replica_index}: {exc} "
                    f"(IPUConfig.floating_point_behaviour {_options_of(self._errstate)} is "
                    "set: the IPU stops with an exception here)") from exc
        except BaseException as exc:
            logger.debug("replica %d raised %r", ctx.replica_index, exc)
            with self._error_lock:
                if self._first_error is None:
                    self._first_error = exc
                    _note_replica(exc, ctx.replica_index)
            if not isinstance(exc, WiderReplicasNeeded):  # (a restart, not a failure)
                for listener in self._failure_listeners:
                    listener(exc)
            raise
        finally:
            _current.ctx = None

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


#: the note on an exception a replica function raised (read by poprun's test jobs to name
#: the replica: poprun._job_instance.replica_of)
REPLICA_NOTE = "raised in the replica function of replica {index}"


def _note_replica(exc: BaseException, index: int) -> None:
    """Add :data:`REPLICA_NOTE` to ``exc`` (PEP 678; once, the innermost replica's)."""
    if hasattr(exc, "add_note") and not any(
            str(n).startswith(REPLICA_NOTE[:40]) for n in getattr(exc, "__notes__", ())):
        exc.add_note(REPLICA_NOTE.format(index=index))


def _options_of(errstate: dict) -> str:
    names = {"invalid": "inv", "divide": "div0", "over": "oflo"}
    return "/".join(names[k] for k in errstate)


_runner = threading.local()


def set_active_runner(runner: Callable[[Callable[[], Any]], list] | None):
    """Install ``runner`` for this thread; returns the previous one (to restore it).

    A runner is ``runner(fn) -> list``: it calls ``fn()`` once per local replica (in replica
    contexts) and returns the results in local replica order. A strategy installs its own in
    its ``scope()`` so that ``ipu_compiler.compile`` runs on every local replica (ipu_node may
    not import the strategies).
    """
    previous = getattr(_runner, "fn", None)
    _runner.fn = runner
    return previous


def active_runner() -> Callable[[Callable[[], Any]], list] | None:
    """The runner installed in this thread by :func:`set_active_runner`, or None."""
    return getattr(_runner, "fn", None)
