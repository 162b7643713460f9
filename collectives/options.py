"""Options of the collectives, read once from the environment (the one place that does).

| variable                       | meaning                                               | default |
|--------------------------------|-------------------------------------------------------|---------|
| ``IPUPOD_STALL_WARNING_S``     | seconds a replica waits before a warning names the    | 60      |
|                                | replicas or instances that have not arrived           |         |
| ``IPUPOD_COLLECTIVE_TIMEOUT_S``| seconds before the wait becomes a CollectiveTimeoutError | 300  |
| ``IPUPOD_CONNECT_TIMEOUT_S``   | seconds the gRPC transport tries to reach the          | 60      |
|                                | coordinator and waits for every instance to register   |         |
| ``IPUPOD_HEARTBEAT_TIMEOUT_S`` | seconds of silence after which the gRPC coordinator   | 5       |
|                                | declares an instance lost, and an instance the         |         |
|                                | coordinator (heartbeats go every tenth of it, <= 0.5 s)|         |
| ``IPUPOD_KEEP_FREED_MEMORY``   | 1: a multi-instance job keeps freed large blocks for   | 1       |
|                                | reuse (see collectives/_engine/allocator.py); 0: glibc's default  |         |
| ``IPUPOD_GRPC_SHM``            | 1: gRPC peers on the same host move tensor bytes       | 1       |
|                                | through shared memory (gRPC carries the control); 0:   |         |
|                                | every byte in gRPC messages                            |         |
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

STALL_WARNING_ENV = "IPUPOD_STALL_WARNING_S"
TIMEOUT_ENV = "IPUPOD_COLLECTIVE_TIMEOUT_S"
CONNECT_TIMEOUT_ENV = "IPUPOD_CONNECT_TIMEOUT_S"
HEARTBEAT_TIMEOUT_ENV = "IPUPOD_HEARTBEAT_TIMEOUT_S"
KEEP_FREED_MEMORY_ENV = "IPUPOD_KEEP_FREED_MEMORY"
GRPC_SHM_ENV = "IPUPOD_GRPC_SHM"


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:   # nan would switch every timeout off
        raise ValueError(f"{name}={raw!r} must be a finite number of seconds > 0")
    return value


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "yes", "true"):
        return True
    if raw in ("0", "no", "false"):
        return False
    raise ValueError(f"{name}={raw!r} must be 1 or 0 (yes/no, true/false)")


def fits_cores(process_count: int) -> bool:
    """Whether ``process_count`` instances of a job fit this machine's cores
    (``os.cpu_count()``). Where they do not, a waiting instance must not spin: it would take
    the core a peer needs."""
    return process_count <= (os.cpu_count() or 1)


@dataclass(frozen=True)
class CollectiveOptions:
    """How long collectives wait (wall seconds).

    Attributes:
        stall_warning_s: a waiting replica logs a warning naming the missing ones after this.
        timeout_s: the wait raises :class:`~collectives.errors.CollectiveTimeoutError` after this.
        connect_timeout_s: the gRPC transport gives up reaching the coordinator, or waiting
            for every instance to register, after this.
        keep_freed_memory: a multi-instance job keeps freed large blocks for reuse.
        grpc_shm: the gRPC transport moves tensor bytes between peers on the same host
            through shared memory (see collectives/transports/grpc/shm/channel.py).
        heartbeat_timeout_s: a gRPC instance counts the coordinator lost after this long
            without an answer (the coordinator reads the same variable for instances;
            5 s: ipupod assumption, ten heartbeats of a live process on a loaded machine).
        arrival_spin_s: a wait for peers that may still be computing polls without yielding
            the CPU for this long before it yields between polls
            (:class:`~collectives.waiting.Patience`). 50 us (ipupod assumption: a small
            message between running peers arrives within it); the runtime sets 0 when the
            job has more instances than this machine has cores, where a spinning instance
            takes the core its peer needs (measured on the 2-core VM, 4 instances, 4 KiB
            cross_replica_sum: 1009 us with the spin, 456 us without; 2 instances: the same
            within noise). It was 0.5 ms: with other jobs on the machine, two instances
            that came to share a core took turns spinning it away from each other, every
            call then waiting about a spin (2 instances, 4 KiB broadcast, 20 calls a
            batch: whole runs at 590-730 us a call, in 6 of 16 runs, against 22-40 us;
            none in 4 runs with 50 us, whose other calls kept their time).
    """

    stall_warning_s: float = 60.0
    timeout_s: float = 300.0
    connect_timeout_s: float = 60.0
    keep_freed_memory: bool = True
    grpc_shm: bool = True
    heartbeat_timeout_s: float = 5.0
    arrival_spin_s: float = 0.00005

    @classmethod
    def for_job(cls, process_count: int) -> "CollectiveOptions":
        """:meth:`from_env`, with ``arrival_spin_s`` 0 when the job's ``process_count``
        instances outnumber this machine's cores (:func:`fits_cores`)."""
        options = cls.from_env()
        if not fits_cores(process_count):
            options = replace(options, arrival_spin_s=0.0)
        return options

    @classmethod
    def from_env(cls) -> "CollectiveOptions":
        return cls(_seconds(STALL_WARNING_ENV, cls.stall_warning_s),
                   _seconds(TIMEOUT_ENV, cls.timeout_s),
                   _seconds(CONNECT_TIMEOUT_ENV, cls.connect_timeout_s),
                   _flag(KEEP_FREED_MEMORY_ENV, cls.keep_freed_memory),
                   _flag(GRPC_SHM_ENV, cls.grpc_shm),
                   _seconds(HEARTBEAT_TIMEOUT_ENV, cls.heartbeat_timeout_s))
