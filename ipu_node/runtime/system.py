"""The configured IPU system of this process (one instance of a job).

``IPUConfig.configure_ipu_system()`` builds an :class:`IPUSystem`: the simulated IPUs of each
TF device, this instance's share of the global replicas, and the executor that runs replica
functions. Other packages (collectives, strategies) find it with :func:`get_system`.

The options that act here (each option's docstring in :mod:`ipu_node.config` says so):
``device_connection.type`` (when the IPUs are attached: :meth:`IPUSystem.require_attached`),
``io_tiles.num_io_tiles`` (SRAM for tensors: compute tiles only), ``floating_point_behaviour``
(numpy error states in the replica threads), TF-IPU's configure-time checks
(:func:`ipu_node.config.check_config`), and a derived ``ipus_per_replica`` (:func:`widen_replicas`).
Hooks (:func:`add_configure_hook`) let a strategy made before the system fill in the job's
distribution when the program configures it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Sequence

from ipu_node.errors import (AlreadyConfiguredError, DeviceNotAttachedError, IPUConfigError,
                             NotConfiguredError)
from ipu_node.hardware.systems import SystemModel, get_system_model
from ipu_node.runtime.attach import Attachment, Unattached, attach, attach_chosen, relayout
from ipu_node.runtime.config import DeviceConnectionType, IPUConfig, check_config, install_configure
from ipu_node.runtime.device import IPU, IPUDevice
from ipu_node.runtime.memory import IPUMemory
from ipu_node.runtime.replica import ReplicaContext, ReplicaExecutor

logger = logging.getLogger("ipu_node.system")  # (fixed: programs set loggers by name)

_lock = threading.Lock()
_system: "IPUSystem | None" = None
_hooks: list[Callable[[IPUConfig], None]] = []


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
        model: the :class:`~ipu_node.hardware.systems.SystemModel` the IPUs belong to (None when
            built by hand without one).
        memory: an :class:`~ipu_node.runtime.memory.IPUMemory` per attached IPU, by IPU id; its
            capacity is the SRAM of the compute tiles (``io_tiles.num_io_tiles`` excluded).
        replication_derived: ``ipus_per_replica`` was not set: the first pipeline may widen
            the replicas (:func:`widen_replicas`) until the layout is bound.
        layout_bound_by: what bound the replica layout (None while it may still change).
        ipu_model: the IPUs are IPU Model devices (``TF_POPLAR_FLAGS=--use_ipu_model``),
            which hold no lock of the machine's IPUs.
    """

    def __init__(self, config: IPUConfig, devices: Sequence[IPUDevice], *,
                 model: SystemModel | None = None, attachment: Attachment | None = None,
                 ipus_per_replica: int | None = None, ipu_model: bool = False):
        self.config = config
        self.ipu_model = ipu_model
        self.devices = tuple(devices)
        self.model = model
        io = config.io_tiles.num_io_tiles
        self.memory = {ipu.id: IPUMemory(ipu, ipu.sram_bytes // ipu.tiles * (ipu.tiles - io))
                       for d in self.devices for ipu in d.ipus}
        self.ipus_per_replica = ipus_per_replica or config.ipus_per_replica
        self.replication_derived = ipus_per_replica is None and \
            not config.is_set("ipus_per_replica") and len(self.devices[0].ipus) > 1
        self.layout_bound_by: str | None = None if self.replication_derived else "the config"
        self._attachment = attachment
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
        self._closers: list[Callable[[], None]] = [self._release]  # run last-first: freed last
        self.executor = ReplicaExecutor(
            [self.replica_context(i) for i in range(self.num_local_replicas)],
            errstate=config.floating_point_behaviour.errstate())

    @property
    def connection(self) -> DeviceConnectionType:
        """``device_connection.type`` of the configuration."""
        return self.config.device_connection.type

    def _release(self) -> None:
        if self._attachment is not None:
            self._attachment.release()

    @property
    def ipus_attached(self) -> bool:
        """Whether this system holds its IPUs (True unless :meth:`release_ipus` let them go
        and :meth:`reattach_ipus` has not taken them back; True when built without an
        attachment; False while an ON_DEMAND system has not attached yet)."""
        return self._attachment is None or self._attachment.attached

    def release_ipus(self) -> None:
        """Let the IPUs go (other processes and attachments may take them, ``gc-monitor``
        no longer lists them) while the system stays configured: its replica contexts,
        memories and whatever serves its replicas (the collective engine, its transport)
        stay. PopTorch's ``detachFromDevice`` (poptorch reference §5.6). Idempotent."""
        self._release()

    def reattach_ipus(self) -> None:
        """Hold the same IPUs again after :meth:`release_ipus` (PopTorch's
        ``attachToDevice``); nothing happens while they are held, or for an ON_DEMAND system
        that has not attached yet (:meth:`require_attached` does that).

        Raises:
            IPUBusyError: one of them is attached by another process or attachment now.
        """
        if self._attachment is not None and self._attachment.scope != Unattached.scope:
            self._attachment.reattach()

    def require_attached(self, what: str) -> None:
        """Make sure the IPUs are attached before ``what`` runs on them: ON_DEMAND attaches
        them now (once); NEVER and PRE_COMPILE never do.

        Raises:
            DeviceNotAttachedError: ``device_connection.type`` is NEVER or PRE_COMPILE.
            IPUBusyError: ON_DEMAND, and another process holds one of the IPUs.
        """
        kind = self.connection
        if kind in (DeviceConnectionType.NEVER, DeviceConnectionType.PRE_COMPILE):
            raise DeviceNotAttachedError(
                f"{what} cannot run: device_connection.type is DeviceConnectionType."
                f"{kind.name}, so no IPUs are attached (ipupod emulates the compile-only "
                "configuration; configure with DeviceConnectionType.ALWAYS or ON_DEMAND to "
                "run)")
        if kind is DeviceConnectionType.ON_DEMAND and not self.ipu_model:
            with _lock:
                if self._attachment is not None and \
                        self._attachment.scope == Unattached.scope:
                    self._attachment = attach_chosen(self.config, self._attachment)
                    logger.info("ON_DEMAND: attached IPUs %s for %s",
                                [i.id for d in self.devices for i in d.ipus], what)

    def bind_layout(self, reason: str) -> None:
        """From now on the replica layout stays (``reason`` says what depends on it)."""
        if self.layout_bound_by is None:
            self.layout_bound_by = reason

    def can_widen(self, shards: int) -> bool:
        """Whether :func:`widen_replicas` may give each replica ``shards`` IPUs."""
        return (self.layout_bound_by is None and shards > self.ipus_per_replica
                and len(self.devices[0].ipus) % shards == 0)

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
        """Run ``fn`` once per local replica (see :meth:`ReplicaExecutor.run`).

        Raises:
            DeviceNotAttachedError, IPUBusyError: see :meth:`require_attached`.
        """
        self.require_attached("a replica function")
        return self.executor.run(fn, args, kwargs)

    def add_closer(self, closer: Callable[[], None]) -> None:
        """Call ``closer()`` when this system is replaced or reset (e.g. to close a
        transport). In a multi-instance job this binds the replica layout: its transport
        cannot be started again cheaply in the middle of the job (gRPC's coordinator would
        hand out the peers' closed addresses; an MPI communicator still being duplicated
        would stay pending), so :func:`widen_replicas` must not replace it. A local
        transport is closed and started again by a widening."""
        if self.transport != "local":
            self.bind_layout(f"the {self.transport} transport, started on this layout")
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
    """``device_connection.version`` for a compile-only connection, else ``ipu_model.version``
    if assigned (seed 004:1764), else the system's native version."""
    dc = config.device_connection
    if dc.version and dc.type in (DeviceConnectionType.NEVER, DeviceConnectionType.PRE_COMPILE):
        return dc.version
    model_cfg = config.ipu_model
    return model_cfg.version if model_cfg.is_set("version") else model.version


def _tiles(config: IPUConfig) -> int:
    """``ipu_model.tiles_per_ipu``, else TF_POPLAR_FLAGS' ``--ipu_model_tiles`` under
    ``--use_ipu_model`` (the flag yields to the option, as TF-IPU's), else 0 (standard)."""
    if config.ipu_model.tiles_per_ipu:
        return config.ipu_model.tiles_per_ipu
    from ipu_node.runtime.flags import poplar_flags
    flags = poplar_flags()
    return flags.ipu_model_tiles if flags.use_ipu_model and flags.ipu_model_tiles > 0 else 0


def _build_devices(config: IPUConfig, attachment: Attachment) -> list[IPUDevice]:
    version = _ipu_version(config, attachment.model)
    tiles = _tiles(config)
    devices = [IPUDevice(d.ordinal, tuple(IPU.of_version(i, version, tiles) for i in d.ipus),
                         d.device_id)
               for d in attachment.devices]
    io = config.io_tiles.num_io_tiles
    if io and any(io >= ipu.tiles for d in devices for ipu in d.ipus):
        raise IPUConfigError(f"io_tiles.num_io_tiles ({io}) leaves no compute tiles: the IPUs "
                             f"have {devices[0].ipus[0].tiles} tiles")
    return devices


def _attach_line(device: IPUDevice) -> str:
    """The attach log line of seed 002:94 (one IPU) and 002:229 (a multi-IPU device id)."""
    if len(device.ipus) == 1 and device.device_id is not None:
        return f"Device {device.name} attached to IPU: {device.device_id}"
    if device.device_id is not None:
        return f"Device {device.name} attached to IPUs: {device.device_id}"
    ids = ", ".join(str(ipu.id) for ipu in device.ipus)
    return (f"Device {device.name} attached to IPUs: {ids} "
            f"(ipupod: {len(device.ipus)} IPUs form no gc-info device)")


def add_configure_hook(hook: Callable[[IPUConfig], None]) -> Callable[[], None]:
    """Call ``hook(config)`` at the start of every :func:`configure` (before the checks),
    e.g. for a strategy made before the system to fill in the job's distribution. Returns a
    function that removes the hook."""
    _hooks.append(hook)

    def remove() -> None:
        if hook in _hooks:
            _hooks.remove(hook)
    return remove


def configure(config: IPUConfig, *, ipus_per_replica: int | None = None) -> IPUSystem:
    """Make ``config`` this process's IPU system (``IPUConfig.configure_ipu_system``).

    The system model is ``config.system``, else ``$IPUPOD_SYSTEM``, else POD16. The previous
    system of this process is closed (and its IPUs freed) before the new IPUs are attached; if
    attaching fails, the process is left without a system. ``device_connection.type`` ALWAYS
    attaches the IPUs now; ON_DEMAND and the compile-only NEVER/PRE_COMPILE choose them
    without attaching (:meth:`IPUSystem.require_attached`).

    Args:
        ipus_per_replica: lay the replicas out with this many IPUs each instead of
            ``config.ipus_per_replica`` (:func:`widen_replicas`; the config is not changed).

    Raises:
        IPUConfigError: the options do not describe a usable system (unknown system, device id
            out of range, more IPUs than the system has, :func:`check_config`'s rules, ...).
        IPUBusyError: the IPUs are attached by another process.
        AlreadyConfiguredError: replicas of the current system are running.
    """
    global _system
    from ipu_node.runtime import flags

    for hook in list(_hooks):
        hook(config)
    check_config(config)
    poplar = flags.poplar_flags()
    flags.engine_options()  # (malformed JSON is an error now, not at exit)
    flags.configure_logging()
    if poplar.executable_cache_path:
        os.makedirs(poplar.executable_cache_path, mode=0o700, exist_ok=True)
    model = get_system_model(config.system or None)
    with _lock:
        old = _system
        if old is not None and old.executor.running:
            raise AlreadyConfiguredError(
                "configure_ipu_system() called while replicas are running")
        _system = None
    if old is not None:
        old.close()
    # IPU Model devices (--use_ipu_model) are not the machine's IPUs: nothing to lock
    occupancy = None if (config.device_connection.type is DeviceConnectionType.ALWAYS
                         and not poplar.use_ipu_model) else Unattached()
    attachment = attach(config, model, occupancy, ipus_per_replica=ipus_per_replica)
    try:
        system = IPUSystem(config, _build_devices(config, attachment), model=model,
                           attachment=attachment, ipus_per_replica=ipus_per_replica,
                           ipu_model=poplar.use_ipu_model)
    except BaseException:
        attachment.release()
        raise
    with _lock:
        _system = system
    for device in system.devices:
        if occupancy is None:
            logger.info("%s", _attach_line(device))
        else:
            logger.info("%s (device_connection.type %s: not attached yet)",
                        _attach_line(device), config.device_connection.type.name)
    return system


def widen_replicas(shards: int) -> IPUSystem:
    """Lay the configured system out again with ``shards`` IPUs per replica: the replication
    factor derived from a pipeline's shards, as TF-IPU derives it from the compiled graph
    (the device's IPUs over the shards). The device keeps its IPUs (and this process keeps
    holding them; only their split into replicas changes); the new layout is bound.

    Raises:
        IPUConfigError: the layout may no longer change (:attr:`IPUSystem.layout_bound_by`
            says why), or ``shards`` does not divide the device's IPUs.
        NotConfiguredError: no system is configured.
        AlreadyConfiguredError: replicas of the system are running.
    """
    global _system
    old = get_system()
    if not old.can_widen(shards):
        why = (f"it was bound by {old.layout_bound_by}" if old.layout_bound_by else
               f"/device:IPU:0's {len(old.devices[0].ipus)} IPUs are not a multiple of "
               f"{shards}")
        raise IPUConfigError(f"cannot give each replica {shards} IPUs: {why}")
    attachment = relayout(old._attachment, old.config, shards)
    with _lock:
        if old.executor.running:
            raise AlreadyConfiguredError("widen_replicas() called while replicas are running")
        _system = None
    old._attachment = None  # (the new system holds the lease now)
    old.close()
    new = IPUSystem(old.config, _build_devices(old.config, attachment), model=old.model,
                    attachment=attachment, ipus_per_replica=shards, ipu_model=old.ipu_model)
    new.replication_derived, new.layout_bound_by = True, f"a pipeline of {shards} shards"
    with _lock:
        _system = new
    logger.info("replicas widened to %d IPUs each (a pipeline of %d shards on /device:IPU:0's "
                "%d IPUs): %d local replicas", shards, shards, len(new.devices[0].ipus),
                new.num_local_replicas)
    return new


def current_system() -> IPUSystem | None:
    """The configured system, or None."""
    return _system


def get_system() -> IPUSystem:
    """The configured system.

    Raises:
        NotConfiguredError: ``configure_ipu_system()`` has not been called in this process.
    """
    system = _system
    if system is None:
        raise NotConfiguredError(
            "no IPU system is configured: create an IPUConfig, set auto_select_ipus (or call "
            "popdist.set_ipu_config(cfg)), then call configure_ipu_system (cfg.configure_ipu_"
            "system() or ipu_node.utils.configure_ipu_system(cfg))")
    return system


def reset_ipu_configuration() -> None:
    """Detach the IPUs of this process; a new ``configure_ipu_system()`` may follow."""
    global _system
    with _lock:
        old, _system = _system, None
    if old is not None:
        old.close()


# IPUConfig.configure_ipu_system and ipu_node.config's functions call these (config never
# imports this module)
install_configure(configure, current_system, reset_ipu_configuration)
