"""The emulated IPUs of a model (poptorch reference §5.6, §7.4).

A model attaches ``replicas x IPUs per replica`` IPUs (rounded up to a power of two with
``autoRoundNumIPUs``, else PopTorch's error) when it is compiled, and releases them on
``detachFromDevice``/``destroy``; ``gc-monitor`` lists them (ipu_node's occupancy). Two
models that together need more IPUs than are free get PopTorch's ``Failed to acquire``.

Two kinds of attachment:

* a **job device**: a training model with more than one replica in the job runs on this
  process's ``ipu_node`` IPU system: the one configured already when its layout is the
  model's (local replicas, process count and index: e.g. by a program that configured it for
  Horovod), else one it configures (``popdist``'s layout under poprun). Its replicas run
  through the strategies' replica threads and reduce through GCL's collectives; detaching
  lets the IPUs go and keeps the system and its transport (``IPUSystem.release_ipus``). More
  than one such model of the same layout may be attached at a time (Graphcore's applications
  keep a training and a validation model with replicas in one process): they share the
  system, whose IPUs are released when the last of them detaches, and each counts its own
  tensors in the IPUs' SRAM (names prefixed ``model<k>/``). ipupod assumption: PopTorch would
  give each model IPUs of its own; here they share the system's, so that their collectives
  share its transport. A model of another layout is refused while one is attached.
* a **free device**: any other model takes the first free gc-info device of its size
  (``ipu_node.attach_free_device``), under poprun among its instance's IPUs.

A replica of a model with blocks over several IPUs has ``ipus_per_replica`` IPUs in either
kind. What a model keeps on each IPU of a replica is counted in its SRAM
(``ipu_node.IPUMemory``, :mod:`poptorch.modelling._memory`); PopTorch's out-of-memory error when it
does
not fit. Each IPU has a modelled timeline: the configured system's
(:func:`ipu_node.clock.timeline`) for a job device, its own (an ``ipu_node.clock.Timeline``)
for a free one.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Callable

import ipu_node
from poprun import popdist

from poptorch._errors import Error, createPoptorchError
from poptorch._logging import logger

__all__ = ["Device", "ipus_to_reserve", "attach_free", "attach_job"]

#: the IPU system this package configured, and the models attached to it now
_job: dict = {"system": None, "owners": weakref.WeakSet()}
#: numbers of the models' tensor names on a shared job system
_numbers = itertools.count()


def ipus_to_reserve(replicas: int, ipus_per_replica: int, auto_round: bool) -> int:
    """IPUs a model reserves in its process: replicas x IPUs per replica, a power of two.

    Raises:
        poptorch.Error: not a power of two without ``autoRoundNumIPUs``, or more than 64.
    """
    wanted = replicas * ipus_per_replica
    rounded = 1 << (wanted - 1).bit_length()
    if rounded != wanted:
        if not auto_round:
            raise createPoptorchError(
                f"The model specifies the use of {wanted} IPUs, however PopTorch must reserve "
                f"a minimum of {rounded} in order to allow the model to run, because PopTorch "
                "must reserve a power of 2 or maximum of 64 IPUs per process. Please "
                "reconfigure your model to use a different number of IPUs or set "
                "poptorch.Options().autoRoundNumIPUs(True).")
        logger.warning("The model specifies the use of %d IPUs, %d will be reserved (a power "
                       "of 2)", wanted, rounded)
    if rounded > 64:
        raise createPoptorchError(f"Too many IPUs requested ({rounded}). Experiments that need "
                                  "more than 64 IPUs require distributed execution.")
    return rounded


def _failed(count: int, exc: Exception, device_id: int | None = None) -> Error:
    what = (f"Failed to acquire device Id {device_id}" if device_id is not None
            else f"Failed to acquire {count} IPU(s)")
    return createPoptorchError(f"{what}: {exc}")


class Device:
    """The IPUs of one model's local replicas.

    Attributes:
        replica_ipus: IPU ids of each local replica (``ipus_per_replica`` each).
        memories: ``IPUMemory`` by IPU id.
        job_system: the ``ipu_node.IPUSystem`` of a job device, else None.
        model: the modelled POD (``ipu_node.SystemModel``) the IPUs belong to.
        timelines: the modelled timeline of each IPU, by id.
    """

    def __init__(self, replica_ipus: list[tuple[int, ...]], memories: dict,
                 release: Callable[[], None], reattach: Callable[[], None],
                 attached: Callable[[], bool], job_system=None, model=None,
                 prefix: str = ""):
        self.replica_ipus = replica_ipus
        self.prefix = prefix
        self.memories = memories
        self._release, self._reattach, self._attached = release, reattach, attached
        self.job_system = job_system
        self.model = model if model is not None else ipu_node.get_system_model(None)
        ids = [i for ipus in replica_ipus for i in ipus]
        self.timelines = ({i: ipu_node.clock.timeline(i) for i in ids} if job_system is not None
                          else {i: ipu_node.clock.Timeline(i) for i in ids})
        self._placed: list[tuple[int, str]] = []

    @property
    def attached(self) -> bool:
        return self._attached()

    @property
    def stale(self) -> bool:
        """A job device whose IPU system was replaced (by another model's) since."""
        if self.job_system is None:
            return False
        try:
            return ipu_node.get_system() is not self.job_system
        except ipu_node.NotConfiguredError:
            return True

    def release(self) -> None:
        """Free the tensors placed and let the IPUs go."""
        self.free_tensors()
        self._release()

    def reattach(self, owner=None) -> None:
        """Take the same IPUs again.

        Raises:
            poptorch.Error: "Failed to acquire ..." (another model or process holds one).
        """
        if self.job_system is not None:
            _claim(self.job_system, owner)
        try:
            self._reattach()
        except ipu_node.IPUError as exc:
            raise _failed(sum(len(i) for i in self.replica_ipus), exc) from None

    def replica_timelines(self, replica: int) -> dict:
        """IPU index -> timeline of local replica ``replica``'s IPUs."""
        return {i: self.timelines[ipu] for i, ipu in enumerate(self.replica_ipus[replica])}

    def place(self, replica: int, name: str, nbytes: int, ipu_index: int = 0) -> None:
        """Count ``nbytes`` of tensor ``name`` on IPU ``ipu_index`` of local replica
        ``replica``.

        Raises:
            poptorch.Error: PopTorch's out-of-memory error (the IPU, bytes needed and free,
                the largest tensors).
        """
        ipu = self.replica_ipus[replica][ipu_index]
        name = self.prefix + name
        try:
            self.memories[ipu].allocate(name, int(nbytes), replace=True)
        except ipu_node.IPUOutOfMemoryError as exc:
            self.free_tensors()
            raise Error("Out of memory: Cannot fit all variable data onto one or more tiles. "
                        f"{exc}", type="poplar_graph_memory_allocation_error") from None
        self._placed.append((ipu, name))

    def free_tensors(self) -> None:
        for ipu, name in self._placed:
            try:
                self.memories[ipu].free(name)
            except KeyError:
                pass
        self._placed.clear()


def _instance_pool(model) -> tuple[int, ...] | None:
    """Under poprun, the IPUs of this instance's share of the job's partition."""
    if not popdist.isPopdistEnvSet():
        return None
    try:
        return tuple(ipu_node.gc_device(model, popdist.getDeviceId()).ipus)
    except (ValueError, ipu_node.IPUError):
        return None


def attach_free(replicas: int, ipus_per_replica: int, count: int, label: str,
                ipu_id: int | None = None) -> Device:
    """A free device of ``count`` IPUs (the gc-info device ``ipu_id`` when given).

    Raises:
        poptorch.Error: "Failed to acquire ..." (busy, too few IPUs, unknown id).
    """
    model = ipu_node.get_system_model(None)
    try:
        if ipu_id is not None:
            device = ipu_node.gc_device(model, ipu_id)
            if len(device.ipus) < count:
                raise createPoptorchError(
                    f"useIpuId({ipu_id}): device {ipu_id} has {len(device.ipus)} IPUs, the "
                    f"model needs {count} ({replicas} replicas x {ipus_per_replica})")
            attachment = ipu_node.attach_free_device(model, len(device.ipus),
                                                     within=device.ipus, label=label)
        else:
            attachment = ipu_node.attach_free_device(model, count, within=_instance_pool(model),
                                                     label=label)
    except ipu_node.IPUError as exc:
        raise _failed(count, exc, ipu_id) from None
    ipus = attachment.ipus
    memories = {i: ipu_node.IPUMemory(ipu_node.IPU.of_version(i, model.version)) for i in ipus}
    replica_ipus = [tuple(ipus[r * ipus_per_replica:(r + 1) * ipus_per_replica])
                    for r in range(replicas)]
    return Device(replica_ipus, memories, attachment.release, attachment.reattach,
                  lambda: attachment.attached, model=model)


def _claim(system, owner) -> None:
    """``owner`` attaches to ``system`` (beside the models attached already)."""
    if owner is not None:
        _job["owners"].add(owner)


def _refuse_while_attached(count: int) -> None:
    """Raises: poptorch.Error "Failed to acquire ..." while a model attached to the job's
    system would lose it (a model of another layout wants a new system)."""
    attached = [m for m in _job["owners"] if m._device_attached()]
    if attached:
        raise createPoptorchError(
            f"Failed to acquire {count} IPU(s): another trainingModel with replicas of this "
            "process is attached with another layout (replicas, IPUs per replica); call "
            "detachFromDevice() or destroy() on it first")


def _release_for(system, owner) -> None:
    """``owner`` detaches; the IPUs go with the last model attached."""
    if owner is not None:
        _job["owners"].discard(owner)
    if not any(m is not owner and m._device_attached() for m in _job["owners"]):
        system.release_ipus()


def _reattach_for(system, owner) -> None:
    if not system.ipus_attached:
        system.reattach_ipus()
    _claim(system, owner)


def attach_job(replicas: int, ipus_per_replica: int, count: int, process_id: int,
               num_processes: int, owner, engine_options: dict | None = None) -> Device:
    """This process's IPU system for a training model with replicas across the job.
    ``engine_options``: the model's Poplar engine options (PopTorch's
    ``enableProfiling``): a system this configures gets them as its
    ``compilation_poplar_options``, so that their ``autoReport`` settings ask for the run
    report.

    Raises:
        poptorch.Error: "Failed to acquire ..." (another replicated training model of this
            process is attached, the IPUs are busy, or the launcher does not match
            ``num_processes``).
    """
    system = _job["system"]
    try:
        current = ipu_node.get_system()
    except ipu_node.NotConfiguredError:
        current = None
    same = (current is not None and current.num_local_replicas == replicas and
            current.ipus_per_replica >= ipus_per_replica and
            current.process_count == num_processes and current.process_index == process_id)
    if same and current is not system:
        # configured by the program (or by hvd.init) with this model's layout: use it, and
        # its transport, rather than replace it (Horovod keeps working beside the model)
        _refuse_while_attached(count)
        system = _job["system"] = current
        _job["owners"] = weakref.WeakSet()
    if same:
        try:
            _reattach_for(system, owner)
        except ipu_node.IPUError as exc:
            if num_processes > 1:  # an instance's IPUs are its own: busy is an error
                raise _failed(count, exc) from None
            same = False  # its IPUs were taken meanwhile: configure on free ones
    if not same:
        if current is system and system is not None:
            _refuse_while_attached(count)
        system = _configure(replicas, ipus_per_replica, process_id, num_processes,
                            engine_options)
        _job["system"], _job["owners"] = system, weakref.WeakSet()
        _claim(system, owner)
    ref = weakref.ref(owner) if owner is not None else (lambda: None)
    return Device([tuple(ipu.id for ipu in system.replica_context(r).ipus)
                   for r in range(system.num_local_replicas)],
                  system.memory, lambda: _release_for(system, ref()),
                  lambda: _reattach_for(system, ref()),
                  lambda: system.ipus_attached and ref() in _job["owners"],
                  job_system=system, model=system.model,
                  prefix=f"model{next(_numbers)}/")


def _configure(replicas: int, ipus_per_replica: int, process_id: int, num_processes: int,
               engine_options: dict | None = None):
    """The system of ``replicas`` local replicas (not rounded up: the system has exactly the
    model's replicas, each reducing in the collectives)."""
    count = replicas * ipus_per_replica
    cfg = ipu_node.IPUConfig()
    if num_processes > 1:
        popdist.set_ipu_config(cfg, ipus_per_replica=popdist.getNumIpusPerReplica())
        mrd = cfg.experimental.multi_replica_distribution
        if mrd.process_count != num_processes or mrd.process_index != process_id:
            raise createPoptorchError(
                f"Failed to acquire {count} IPU(s): options.Distributed says process "
                f"{process_id} of {num_processes}, but this instance was started as "
                f"{mrd.process_index} of {max(mrd.process_count, 1)} (poprun or mpirun)")
    cfg.ipus_per_replica = ipus_per_replica
    cfg.auto_select_ipus = count
    reports = {k: str(v) for k, v in (engine_options or {}).items() if k.startswith("autoReport")}
    if reports:
        cfg.compilation_poplar_options = reports
    try:
        return cfg.configure_ipu_system()
    except ipu_node.IPUError as exc:
        raise _failed(count, exc) from None
