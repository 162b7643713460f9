"""The configured IPU system of this process (one instance of a job).

``IPUConfig.configure_ipu_system()`` builds an :class:`IPUSystem`: the simulated IPUs of each
TF device, this instance's share of the global replicas, and the executor that runs replica
functions. Other packages (collectives, strategies) find it with :func:`get_system`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from ipu_node.attach import Attachment, attach
from ipu_node.config import IPUConfig, install_configure
from ipu_node.device import IPU, IPUDevice
from ipu_node.errors import AlreadyConfiguredError, IPUConfigError, NotConfiguredError
from ipu_node.memory import IPUMemory
from ipu_node.replica import ReplicaContext, ReplicaExecutor
from ipu_node.systems import SystemModel, get_system_model

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
        model: the :class:`~ipu_node.systems.SystemModel` the IPUs belong to (None when built
            by hand without one).
        memory: an :class:`~ipu_node.memory.IPUMemory` per attached IPU, by IPU id.
    """

    def __init__(self, config: IPUConfig, devices: Sequence[IPUDevice], *,
                 model: SystemModel | None = None, attachment: Attachment | None = None):
        self.config = config
        self.devices = tuple(devices)
        self.model = model
        self.memory = {ipu.id: IPUMemory(ipu) for d in self.devices for ipu in d.ipus}
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
        self._attachment = attachment
        if attachment is not None:
            self._closers.append(attachment.release)  # closers run last-first: freed last
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

    @property
    def ipus_attached(self) -> bool:
        """Whether this system holds its IPUs (True unless :meth:`release_ipus` let them go
        and :meth:`reattach_ipus` has not taken them back; True when built without an
        attachment)."""
        return self._attachment is None or self._attachment.attached

    def release_ipus(self) -> None:
        """Let the IPUs go (other processes and attachments may take them, ``gc-monitor``
        no longer lists them) while the system stays configured: its replica contexts,
        memories and whatever serves its replicas (the collective engine, its transport)
        stay. PopTorch's ``detachFromDevice`` (poptorch reference §5.6). Idempotent."""
        if self._attachment is not None:
            self._attachment.release()

    def reattach_ipus(self) -> None:
        """Hold the same IPUs again after :meth:`release_ipus` (PopTorch's
        ``attachToDevice``); nothing happens while they are held.

        Raises:
            IPUBusyError: one of them is attached by another process or attachment now.
        """
        if self._attachment is not None:
            self._attachment.reattach()

    def add_closer(self, closer: Callable[[], None]) -> None:
        """Call ``closer()`` when this system is replaced or reset (e.g. to close a transport)."""
        self._closers.append(closer)

    def close(self) -> None:
        """Run the closers (last added first), stop the executor and free the IPUs."""
        for closer in reversed(self._closers):
            closer()
        self._closers.clear()
        self.executor.shutdown()

    def __repr__(self) -> str:
        return (f"IPUSystem(instance {self.process_index}/{self.process_count}, "
                f"replicas {self.replica_index_offset}.."
                f"{self.replica_index_offset + self.num_local_replicas - 1} of {self.num_replicas}, "
                f"ipus_per_replica={self.ipus_per_replica}, transport={self.transport!r})")


def _ipu_version(config: IPUConfig, model: SystemModel) -> str:
    """The system's native version unless ``ipu_model.version`` was assigned (seed 004:1764)."""
    model_cfg = config.ipu_model
    return model_cfg.version if model_cfg.is_set("version") else model.version


def _build_devices(config: IPUConfig, attachment: Attachment) -> list[IPUDevice]:
    version = _ipu_version(config, attachment.model)
    tiles = config.ipu_model.tiles_per_ipu
    return [IPUDevice(d.ordinal, tuple(IPU.of_version(i, version, tiles) for i in d.ipus),
                      d.device_id)
            for d in attachment.devices]


def _attach_line(device: IPUDevice) -> str:
    """The attach log line of seed 002:94 (one IPU) and 002:229 (a multi-IPU device id)."""
    if len(device.ipus) == 1 and device.device_id is not None:
        return f"Device {device.name} attached to IPU: {device.device_id}"
    if device.device_id is not None:
        return f"Device {device.name} attached to IPUs: {device.device_id}"
    ids = ", ".join(str(ipu.id) for ipu in device.ipus)
    return (f"Device {device.name} attached to IPUs: {ids} "
            f"(ipupod: {len(device.ipus)} IPUs form no gc-info device)")


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

    The system model is ``config.system``, else ``$IPUPOD_SYSTEM``, else POD16. The previous
    system of this process is closed (and its IPUs freed) before the new IPUs are attached; if
    attaching fails, the process is left without a system.

    Raises:
        IPUConfigError: the options do not describe a usable system (unknown system, device id
            out of range, more IPUs than the system has, ...).
        IPUBusyError: the IPUs are attached by another process.
        AlreadyConfiguredError: replicas of the current system are running.
    """
    global _system
    _validate(config)
    model = get_system_model(config.system or None)
    with _lock:
        old = _system
        if old is not None and old.executor.running:
            raise AlreadyConfiguredError(
                "configure_ipu_system() called while replicas are running")
        _system = None
    if old is not None:
        old.close()
    attachment = attach(config, model)
    try:
        system = IPUSystem(config, _build_devices(config, attachment), model=model,
                           attachment=attachment)
    except BaseException:
        attachment.release()
        raise
    with _lock:
        _system = system
    for device in system.devices:
        logger.info("%s", _attach_line(device))
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


install_configure(configure)  # IPUConfig.configure_ipu_system calls it (config never imports this)
