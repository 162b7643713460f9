"""The configured IPU system of this process (one instance of a job).

``IPUConfig.configure_ipu_system()`` builds an :class:`IPUSystem`: the simulated IPUs of each
TF device, this instance's share of the global replicas, and the executor that runs replica
functions. Other packages (collectives, strategies) find it with :func:`get_system`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from ipu_node.config import IPUConfig
from ipu_node.device import IPU, IPUDevice
from ipu_node.errors import AlreadyConfiguredError, IPUConfigError, NotConfiguredError
from ipu_node.replica import ReplicaContext, ReplicaExecutor

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_system: "IPUSystem | None" = None


class IPUSystem:
    """One instance's emulated IPUs and replicas.

    Attributes:
        config: the :class:`IPUConfig` it was built from (a snapshot is not taken).
        devices: the TF devices, ``devices[0]`` is ``/device:IPU:0`` where replicas run.
        ipus_per_replica: IPUs each replica occupies.
        num_local_replicas: replicas of this instance.
        process_count: instances of the job (1 without multi-replica distribution).
        process_index: this instance, in ``[0, process_count)``.
        num_replicas: global replication factor (``num_local_replicas * process_count``).
        replica_index_offset: global index of this instance's first replica.
        transport: ``"local"``, ``"mpi"`` or ``"grpc"``: how instances exchange collective data.
    """

    def __init__(self, config: IPUConfig, devices: Sequence[IPUDevice]):
        self.config = config
        self.devices = tuple(devices)
        self.ipus_per_replica = config.ipus_per_replica
        self.num_local_replicas = len(self.devices[0].ipus) // self.ipus_per_replica
        mrd = config.experimental.multi_replica_distribution
        self.process_count = max(mrd.process_count, 1)
        self.process_index = mrd.process_index
        self.num_replicas = self.num_local_replicas * self.process_count
        self.replica_index_offset = self.process_index * self.num_local_replicas
        transport = mrd.transport
        if transport == "auto":
            transport = "mpi" if self.process_count > 1 else "local"
        self.transport = transport
        self._closers: list[Callable[[], None]] = []
        self.executor = ReplicaExecutor(
            [self.replica_context(i) for i in range(self.num_local_replicas)])

    def replica_context(self, local_index: int) -> ReplicaContext:
        """The context of local replica ``local_index``."""
        ipr = self.ipus_per_replica
        ipus = self.devices[0].ipus[local_index * ipr:(local_index + 1) * ipr]
        return ReplicaContext(
            replica_index=self.replica_index_offset + local_index,
            local_index=local_index,
            num_replicas=self.num_replicas,
            num_local_replicas=self.num_local_replicas,
            ipus=tuple(ipus),
        )

    def run_replicas(self, fn: Callable[..., Any], args: Sequence[tuple],
                     kwargs: Sequence[dict]) -> list:
        """Run ``fn`` once per local replica (see :meth:`ReplicaExecutor.run`)."""
        return self.executor.run(fn, args, kwargs)

    def add_closer(self, closer: Callable[[], None]) -> None:
        """Call ``closer()`` when this system is replaced or reset (e.g. to close a transport)."""
        self._closers.append(closer)

    def close(self) -> None:
        for closer in reversed(self._closers):
            closer()
        self._closers.clear()
        self.executor.shutdown()

    def __repr__(self) -> str:
        return (f"IPUSystem(instance {self.process_index}/{self.process_count}, "
                f"replicas {self.replica_index_offset}.."
                f"{self.replica_index_offset + self.num_local_replicas - 1} of {self.num_replicas}, "
                f"ipus_per_replica={self.ipus_per_replica}, transport={self.transport!r})")


def _build_devices(config: IPUConfig, first_ipu_id: int) -> list[IPUDevice]:
    if config.select_ipus not in ([], ()):
        raise IPUConfigError(
            "select_ipus (choosing devices by gc-info id) needs the POD hardware model, "
            "which this version does not have yet; use auto_select_ipus")
    counts = config.device_ipu_counts()
    if not counts or any(c == 0 for c in counts):
        raise IPUConfigError(
            f"auto_select_ipus={config.auto_select_ipus!r} asks for no IPUs; set it to the "
            "number of IPUs (e.g. cfg.auto_select_ipus = 1) or call popdist.set_ipu_config(cfg)")
    version = config.ipu_model.version
    tiles = config.ipu_model.tiles_per_ipu
    devices, next_id = [], first_ipu_id
    for ordinal, count in enumerate(counts):
        ipus = tuple(IPU.of_version(next_id + k, version, tiles) for k in range(count))
        devices.append(IPUDevice(ordinal, ipus))
        next_id += count
    return devices


def _validate(config: IPUConfig) -> None:
    mrd = config.experimental.multi_replica_distribution
    if mrd.process_count and mrd.process_index >= mrd.process_count:
        raise IPUConfigError(
            f"multi_replica_distribution.process_index ({mrd.process_index}) must be less than "
            f"process_count ({mrd.process_count})")
    if mrd.transport == "local" and mrd.process_count > 1:
        raise IPUConfigError(
            f"transport 'local' serves one instance, but process_count is {mrd.process_count}")
    first = config.device_ipu_counts()[:1]
    if first and first[0] % config.ipus_per_replica:
        raise IPUConfigError(
            f"/device:IPU:0 has {first[0]} IPUs, not a multiple of ipus_per_replica "
            f"({config.ipus_per_replica})")


def configure(config: IPUConfig) -> IPUSystem:
    """Make ``config`` this process's IPU system (``IPUConfig.configure_ipu_system``).

    Raises:
        IPUConfigError: the options do not describe a usable system.
        AlreadyConfiguredError: replicas of the current system are running.
    """
    global _system
    _validate(config)
    mrd = config.experimental.multi_replica_distribution
    counts = config.device_ipu_counts()
    # Instance i owns the IPUs of its replicas: global IPU ids are contiguous per instance.
    first_ipu_id = mrd.process_index * sum(counts)
    system = IPUSystem(config, _build_devices(config, first_ipu_id))
    with _lock:
        old = _system
        if old is not None and old.executor.running:
            raise AlreadyConfiguredError(
                "configure_ipu_system() called while replicas are running")
        _system = system
    if old is not None:
        old.close()
    for device in system.devices:
        ids = ", ".join(str(ipu.id) for ipu in device.ipus)
        logger.info("Device %s attached to IPUs: %s", device.name, ids)
    return system


def get_system() -> IPUSystem:
    """The configured system.

    Raises:
        NotConfiguredError: ``configure_ipu_system()`` has not been called in this process.
    """
    system = _system
    if system is None:
        raise NotConfiguredError(
            "no IPU system is configured: create an IPUConfig, set auto_select_ipus (or call "
            "popdist.set_ipu_config(cfg)), then call cfg.configure_ipu_system()")
    return system


def reset_ipu_configuration() -> None:
    """Detach the IPUs of this process; a new ``configure_ipu_system()`` may follow."""
    global _system
    with _lock:
        old, _system = _system, None
    if old is not None:
        old.close()
