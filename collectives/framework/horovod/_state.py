"""Horovod's process state: init/shutdown, ranks, and the process set table.

One Horovod process is one ipupod instance (one launched process): ``rank()`` is the
instance index the launcher gave (mpirun's rank, poprun's instance index, the TF_CONFIG
task), ``size()`` the number of instances. Collectives between them go over the transport
of the configured IPU system (:func:`collectives._engine.runtime.get_engine`).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from typing import Sequence

import numpy as np
from ipu_node import IPUConfig, get_system
from ipu_node.runtime.launched import launched_config
from ipu_node.env import env_int
from ipu_node.errors import NotConfiguredError

from collectives._engine.runtime import get_engine

#: names of the environment variables a plain ``mpirun`` gives each rank (anchors §1.2):
#: Open MPI's, then MPICH Hydra's
_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: set for a TF_CONFIG cluster (or by a launcher other than poprun): their programs configure
#: the IPU system themselves
_JOB_VARS = ("TF_CONFIG", "IPUPOD_NUM_INSTANCES")

_HOST_BYTES = 64


class HorovodNotInitializedError(ValueError):
    """A Horovod function was called before :func:`init` (Horovod raises ValueError too)."""


class ProcessSet:
    """A subset of the Horovod processes that run collectives together (Horovod's class).

    Args:
        ranks: the global ranks of the members (any order; kept sorted, no duplicates).

    Attributes:
        ranks: the members, increasing.
        process_set_id: the id :func:`add_process_set` gave it (0: the global set); None
            until added.
    """

    def __init__(self, ranks: Sequence[int]):
        members = sorted({int(r) for r in ranks})
        if len(members) != len(list(ranks)) or any(r < 0 for r in members):
            raise ValueError(f"ProcessSet ranks must be distinct ranks >= 0, got {list(ranks)}")
        self.ranks = members
        self.process_set_id: int | None = None
        self._calls = 0  # collective calls made on this set by this process

    def _members(self) -> tuple[int, ...]:
        if self.process_set_id is None:
            raise ValueError(f"{self!r} has not been added (hvd.add_process_set)")
        return tuple(self.ranks) if self.ranks else tuple(range(size()))

    def size(self) -> int:
        """Number of processes in the set."""
        return len(self._members())

    def rank(self) -> int:
        """This process's rank within the set.

        Raises:
            ValueError: this process is not a member.
        """
        members = self._members()
        me = rank()
        if me not in members:
            raise ValueError(f"rank {me} is not in process set {self.process_set_id} "
                             f"(ranks {list(members)})")
        return members.index(me)

    def included(self) -> bool:
        """True when this process belongs to the set."""
        return rank() in self._members()

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: the set of every process (Horovod's ``global_process_set``; ranks listed after init)
global_process_set = ProcessSet([])


class _State:
    def __init__(self, rank: int, size: int, ranks_on_hosts: list[str]):
        self.rank = rank
        self.size = size
        hosts = ranks_on_hosts
        same = [r for r in range(self.size) if hosts[r] == hosts[self.rank]]
        self.local_rank, self.local_size = same.index(self.rank), len(same)
        peers = [r for r in range(self.size)
                 if [q for q in range(self.size) if hosts[q] == hosts[r]].index(r)
                 == self.local_rank]
        self.cross_rank, self.cross_size = peers.index(self.rank), len(peers)
        self.sets: dict[int, ProcessSet] = {}
        self.next_id = 1
        self.lock = threading.RLock()

    @property
    def engine(self):
        """The collective engine of the configured IPU system (Horovod follows a system
        configured again with the same instances).

        Raises:
            HorovodNotInitializedError: no IPU system is configured any more, or the one
                configured now has other instances than Horovod was started on.
        """
        try:
            engine = get_engine()
        except NotConfiguredError:
            raise HorovodNotInitializedError(
                "the IPU system Horovod was started on was reset (reset_ipu_configuration) "
                "and no other is configured: configure one with the same instances, or call "
                "hvd.shutdown() and hvd.init()") from None
        if (engine.process_index, engine.transport.process_count) != (self.rank, self.size):
            raise HorovodNotInitializedError(
                f"the IPU system was configured again as instance {engine.process_index} of "
                f"{engine.transport.process_count}, but Horovod was started as rank "
                f"{self.rank} of {self.size}: call hvd.shutdown() and hvd.init()")
        return engine


_state: _State | None = None
_init_lock = threading.Lock()


def _env_int(names: Sequence[str]) -> int | None:
    """The integer in the first of ``names`` that is set (ipu_node's parse and error)."""
    for name in names:
        value = env_int(name)
        if value is not None:
            return value
    return None


def _configure_default_system() -> None:
    """No IPU system is configured: configure this process's default one. Started by poprun,
    the system poprun placed the instance on (its share of the job, read from poprun's
    environment: :func:`ipu_node.runtime.launched.launched_config`); under plain mpirun one
    IPU per MPI rank; alone, rank 0 of 1.

    Raises:
        NotConfiguredError: started with TF_CONFIG (not by poprun): its cluster's
            coordinator is started by ``popdist.set_ipu_config``, which the program calls.
        ValueError: poprun's variables disagree (names them).
    """
    cfg = launched_config()
    if cfg is not None:
        cfg.configure_ipu_system()
        return
    if any(os.environ.get(n) for n in _JOB_VARS):
        raise NotConfiguredError(
            "hvd.init(): this process was started with TF_CONFIG and no IPU system is "
            "configured: configure it first (instance 0 then hosts the cluster's "
            "coordinator): cfg = IPUConfig(); popdist.set_ipu_config(cfg); "
            "cfg.configure_ipu_system()")
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    count = _env_int(_MPI_SIZE_VARS) or 1
    if count > 1:
        mrd = cfg.experimental.multi_replica_distribution
        mrd.process_count = count
        mrd.process_index = _env_int(_MPI_RANK_VARS) or 0
        mrd.transport = "mpi"
    cfg.configure_ipu_system()


def init() -> None:
    """Start Horovod in this process (idempotent: a second call does nothing).

    Uses the configured IPU system's instances and transport; without one, configures one
    IPU per process (plain ``mpirun``: the MPI ranks; alone: rank 0 of 1). Collective over
    every process (each tells the others its host, for :func:`local_rank`). Started by
    poprun without a configured system, configures the one poprun placed this instance on
    (read from poprun's environment). As in Horovod, the IPU system may be
    configured again later (``configure_ipu_system``): Horovod's calls then go over the new
    system's transport, as long as it has the same instances (process count and index);
    one with other instances needs :func:`shutdown` and :func:`init` again.

    Raises:
        NotConfiguredError: started with TF_CONFIG without a configured IPU system.
        CollectiveError: the processes cannot reach each other.
    """
    global _state
    with _init_lock:
        if _state is not None:
            return
        try:
            system = get_system()
        except NotConfiguredError:
            _configure_default_system()
            system = get_system()
        engine = get_engine(system)
        hosts = _exchange_hosts(engine)
        state = _State(engine.process_index, engine.transport.process_count, hosts)
        global_process_set.process_set_id = 0
        global_process_set.ranks = list(range(state.size))
        global_process_set._calls = 0
        state.sets[0] = global_process_set
        _state = state
        if system.transport != "local":
            system.bind_layout("Horovod, started on this layout")


def _exchange_hosts(engine) -> list[str]:
    from collectives.framework.horovod._request import gather_rows, patience_for
    name = socket.gethostname()
    # the host's name and a digest (names longer than the field still compare whole)
    raw = (hashlib.sha256(name.encode()).hexdigest()[:16] + name)[:_HOST_BYTES]
    send = np.frombuffer(raw.encode().ljust(_HOST_BYTES, b"\0"), np.uint8)
    count = engine.transport.process_count
    if count == 1:
        return [raw]
    comm = engine.communicator(tuple(range(count)))
    rows = gather_rows(comm, send.copy(), patience_for(engine, "hvd.init", comm.members))
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in rows]


def shutdown() -> None:
    """Stop Horovod in this process; :func:`init` may follow. Process sets other than the
    global one are forgotten."""
    global _state
    with _init_lock:
        _state = None
        global_process_set.ranks = []


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _state is not None


def state() -> _State:
    """The running state.

    Raises:
        HorovodNotInitializedError: :func:`init` has not been called.
    """
    s = _state
    if s is None:
        raise HorovodNotInitializedError(
            "Horovod has not been initialized; use hvd.init().")
    return s


def size() -> int:
    """Number of Horovod processes (instances of the job)."""
    return state().size


def rank() -> int:
    """This process's rank in ``[0, size())``: the launcher's rank of this instance."""
    return state().rank


def local_size() -> int:
    """Number of Horovod processes on this host."""
    return state().local_size


def local_rank() -> int:
    """This process's rank among the processes on its host (by global rank order)."""
    return state().local_rank


def cross_size() -> int:
    """Number of processes with this process's local rank (one per host when every host
    runs the same number of processes), as Horovod's cross communicator."""
    return state().cross_size


def cross_rank() -> int:
    """This process's rank among the processes with its local rank (its host's index when
    hosts are uniform)."""
    return state().cross_rank


def is_homogeneous() -> bool:
    """Whether every host runs the same number of processes (Horovod's)."""
    s = state()
    return s.size % s.local_size == 0 and s.cross_size * s.local_size == s.size


def mpi_enabled() -> bool:
    """Whether the processes exchange data over MPI (the configured system's transport)."""
    return type(state().engine.transport).__module__.endswith(".mpi")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set (Horovod's dynamic process sets): every process must call it,
    with the same ranks, in the same order. Its members build its communicator here.

    Args:
        process_set: a :class:`ProcessSet` or a list of global ranks.

    Returns:
        The registered :class:`ProcessSet`, its ``process_set_id`` set.

    Raises:
        ValueError: a rank out of ``[0, size())``, an empty set, or a set already added.
    """
    s = state()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps!r} is already added")
    if not ps.ranks or ps.ranks[-1] >= s.size:
        raise ValueError(f"process set ranks {ps.ranks} must be a non-empty subset of "
                         f"[0, {s.size})")
    with s.lock:
        for other in s.sets.values():
            if other.ranks == ps.ranks:
                raise ValueError(f"a process set with ranks {ps.ranks} already exists "
                                 f"(id {other.process_set_id})")
        ps.process_set_id = s.next_id
        s.next_id += 1
        s.sets[ps.process_set_id] = ps
        if s.rank in ps.ranks and len(ps.ranks) > 1:
            s.engine.communicator(tuple(ps.ranks))
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (every process calls it). Returns False for the global set
    or a set that is not registered (as Horovod)."""
    s = state()
    if process_set.process_set_id in (None, 0):
        return False
    with s.lock:
        if s.sets.pop(process_set.process_set_id, None) is None:
            return False
    process_set.process_set_id = None
    return True
