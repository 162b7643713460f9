"""The modelled clock: one timeline of events per simulated IPU, in modelled seconds.

Every IPU of the configured system has a :class:`Timeline`: a list of :class:`Event`
(``start_s``, ``duration_s``, ``kind``, ``label``, ``stage``, ``micro_batch``, ``peer``) in
modelled seconds since the system was configured. It is what the real POD would take, never
wall time. Who writes it:

* pipelines (:mod:`ipu_node.pipelining_ops`): a ``"compute"`` event per stage pass, a
  ``"copy"`` event per inter-IPU transfer of activations or gradients (``peer`` is the
  destination IPU), ``"host_io"`` events for infeed and outfeed, and ``"sync"`` events
  where the BSP rule makes an IPU wait for the others [001:1106-1117];
* collectives, through :func:`charge_collective` (a hook: ``ipu_node`` imports no
  collectives): a ``"collective"`` event on every IPU of every local replica.

Readers (reports, traces: one track per IPU; copies carry ``peer`` so a trace can draw link
tracks) use :func:`timelines` and :meth:`Timeline.events`; :meth:`Event.to_dict` is the JSON
form. Timelines are per process (per instance); they are dropped when the system is
reconfigured or reset.

One BSP step of a pipeline is laid out by :func:`bsp_step` [001:1106-1117]: every IPU computes
its passes one after another from the step's start, all wait for the slowest (sync), then the
step's transfers run at once (exchange); the step ends when the longest transfer does (the
numpy pipeline and the PopTorch front end both lay their steps out with it).

Compute time of ``flops`` floating-point operations: ``flops / (peak_flops(version, dtype) *
IPUConfig.execution.compute_efficiency)``.
"""

from __future__ import annotations

import threading
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from ipu_node.hardware import chips as _chips

from ipu_node.runtime import system as _system_mod
from ipu_node.runtime.config import ExecutionConfig

__all__ = ["Event", "Timeline", "EVENT_KINDS", "timeline", "timelines", "reset_timelines",
           "charge_collective", "peak_flops", "compute_time_s", "compute_efficiency",
           "efficiency_overridden", "BSPStep", "bsp_step"]

#: The kinds of event a timeline holds.
EVENT_KINDS = ("compute", "copy", "host_io", "sync", "collective")

#: The chip of each IPU version (ipu_node.chips, every number with its source); a configured
#: Bow POD (``BOW-POD*``) prices its ipu2 IPUs as Bow.
_CHIP_OF_VERSION = {"ipu2": _chips.GC200, "ipu1": _chips.GC2}


def peak_flops(version: str, dtype) -> float:
    """Peak FLOP/s of one IPU of ``version`` (``"ipu1"``/``"ipu2"``) for ``dtype``.

    float16 and float32 have their own peaks; every other dtype (float64, integers) is priced
    at the float32 peak (ipupod assumption: the IPU has no float64 units, and numpy programs
    in float64 still get a time). The figures are :mod:`ipu_node.chips`' (GC200: the
    IPU-POD64 datasheet's 15.978 PFLOPS FP16.16 and 3.994 PFLOPS FP32 over 64 IPUs; Bow:
    1.4 PFLOPS per Bow-2000 of 4; GC2: an ipupod assumption); an ipu2 of a configured Bow POD
    is a Bow.

    Raises:
        ValueError: unknown ``version``.
    """
    name = np.dtype(dtype).name if dtype is not None else "float32"
    chip = _CHIP_OF_VERSION.get(version)
    if chip is None:
        raise ValueError(f"no peak FLOP/s for IPU version {version!r}; known: ipu1, ipu2")
    system = _system_mod._system
    model = getattr(system, "model", None) if system is not None else None
    if version == "ipu2" and model is not None and model.chip == _chips.BOW.name:
        chip = _chips.BOW
    return chip.peak_flops(name if name in ("float16", "float32") else "float32")


def compute_efficiency() -> float:
    """``IPUConfig.execution.compute_efficiency`` of the configured system (the default if
    none is configured), times the share of each IPU's tiles that compute: tiles reserved
    with ``io_tiles.num_io_tiles`` do I/O only."""
    system = _system_mod._system
    if system is None:
        return ExecutionConfig._options["compute_efficiency"].default
    efficiency = system.config.execution.compute_efficiency
    io = system.config.io_tiles.num_io_tiles
    if io:
        tiles = system.devices[0].ipus[0].tiles
        efficiency *= (tiles - io) / tiles
    return efficiency


def efficiency_overridden() -> bool:
    """Whether the configured system sets ``IPUConfig.execution.compute_efficiency`` to other
    than its default: then front ends price compute as ``FLOPs / (peak x efficiency)``
    (the documented override), else by the per-operation compute model
    (:mod:`collectives.performance.compute_model`)."""
    system = _system_mod._system
    return system is not None and system.config.execution.compute_efficiency != \
        ExecutionConfig._options["compute_efficiency"].default


def compute_time_s(flops: float, dtype, version: str = "ipu2",
                   efficiency: float | None = None) -> float:
    """Modelled seconds of ``flops`` operations on one IPU: ``flops / (peak * efficiency)``.

    Raises:
        ValueError: ``flops < 0``.
    """
    if flops < 0:
        raise ValueError(f"flops must be >= 0, got {flops!r}")
    if not flops:
        return 0.0
    eff = compute_efficiency() if efficiency is None else efficiency
    return float(flops) / (peak_flops(version, dtype) * eff)


class Event(NamedTuple):
    """One interval of an IPU's modelled timeline (immutable; a named tuple, cheap to make).

    Attributes:
        start_s: modelled seconds since the system was configured.
        duration_s: modelled seconds.
        kind: one of :data:`EVENT_KINDS`.
        label: what ran, e.g. ``"F1"`` (forward of stage 1), ``"cross_replica_mean"``.
        stage: the pipeline stage, or None.
        micro_batch: the micro-batch, or None.
        peer: the other end of a copy (an IPU id), or None.
    """

    start_s: float
    duration_s: float
    kind: str
    label: str
    stage: int | None = None
    micro_batch: int | None = None
    peer: int | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def to_dict(self) -> dict:
        """The JSON form (plain types)."""
        return self._asdict()


class Timeline:
    """The modelled timeline of one IPU. Thread-safe.

    Attributes:
        ipu_id: the IPU.
        now_s: where the next event starts (the end of the latest event).
    """

    def __init__(self, ipu_id: int):
        self.ipu_id = ipu_id
        self.now_s = 0.0
        self._events: list[Event] = []
        # the one-IPU collective charges not yet made Events, (start_s, duration_s, label),
        # after every event of _events (charge_collective: a plain tuple is cheaper to make
        # on every collective call; readers make the Events, _fold)
        self._charged: list[tuple[float, float, str]] = []
        self._lock = threading.Lock()

    def _fold(self) -> None:
        """Make the pending collective charges Events, in order (under the lock)."""
        if self._charged:
            self._events.extend([Event(start, duration, "collective", label)
                                 for start, duration, label in self._charged])
            self._charged.clear()

    def add(self, kind: str, duration_s: float, label: str, *, start_s: float | None = None,
            stage: int | None = None, micro_batch: int | None = None,
            peer: int | None = None) -> Event:
        """Append an event starting at ``start_s`` (default :attr:`now_s`); ``now_s`` moves
        to its end if that is later.

        Raises:
            ValueError: an unknown kind, or a negative duration.
        """
        if kind not in EVENT_KINDS:
            raise ValueError(f"event kind must be one of {EVENT_KINDS}, got {kind!r}")
        if duration_s < 0:
            raise ValueError(f"duration_s must be >= 0, got {duration_s!r}")
        with self._lock:
            self._fold()
            start = self.now_s if start_s is None else start_s
            event = Event(start, duration_s, kind, label, stage, micro_batch, peer)
            self._events.append(event)
            if event.end_s > self.now_s:
                self.now_s = event.end_s
            return event

    def extend(self, events: list[Event], end_s: float | None = None) -> None:
        """Append ready-made events (the caller checked kinds and durations); ``now_s``
        moves to the latest end (``end_s``: that end, when the caller knows it)."""
        with self._lock:
            self._fold()
            self._events.extend(events)
            if end_s is not None:
                end = end_s
            else:
                end = max(e.start_s + e.duration_s for e in events) if events else self.now_s
            if end > self.now_s:
                self.now_s = end

    def wait_until(self, t_s: float, label: str = "sync") -> None:
        """BSP synchronisation: a ``"sync"`` event from :attr:`now_s` to ``t_s`` (nothing if
        the IPU is there already)."""
        if t_s > self.now_s:
            self.add("sync", t_s - self.now_s, label)

    def events(self) -> list[Event]:
        """A copy of the events, in the order they were added."""
        with self._lock:
            self._fold()
            return list(self._events)

    def busy_s(self, kinds: Iterable[str] = ("compute",)) -> float:
        """Sum of the durations of the events of ``kinds``."""
        kinds = set(kinds)
        with self._lock:
            self._fold()
            return sum(e.duration_s for e in self._events if e.kind in kinds)

    def __repr__(self) -> str:
        events = len(self._events) + len(self._charged)
        return f"Timeline(ipu {self.ipu_id}, {events} events, now {self.now_s:.3e} s)"


_lock = threading.Lock()
_owner: object | None = None  # the IPUSystem the timelines belong to
_timelines: dict[int, Timeline] = {}
_local: list[Timeline] = []   # the timelines of the local replicas' IPUs


def _forget(system: object) -> None:
    global _owner
    with _lock:
        if _owner is system:
            _owner = None
            _timelines.clear()
            _local.clear()


def _current() -> dict[int, Timeline]:
    """The timelines of the configured system (made on first use)."""
    global _owner
    system = _system_mod.get_system()
    if _owner is not system:
        with _lock:
            if _owner is not system:
                _timelines.clear()
                _timelines.update({ipu_id: Timeline(ipu_id) for ipu_id in system.memory})
                ipus = system.devices[0].ipus[:system.num_local_replicas *
                                              system.ipus_per_replica]
                _local[:] = [_timelines[ipu.id] for ipu in ipus]
                _owner = system
                system.add_closer(lambda: _forget(system))
    return _timelines


def timeline(ipu_id: int) -> Timeline:
    """The timeline of IPU ``ipu_id`` of this process.

    Raises:
        NotConfiguredError: no IPU system is configured.
        KeyError: the IPU is not attached by this process (names the attached ones).
    """
    tls = _current()
    if ipu_id not in tls:
        raise KeyError(f"IPU {ipu_id} is not attached by this process (attached: {sorted(tls)})")
    return tls[ipu_id]


def timelines() -> dict[int, Timeline]:
    """Every attached IPU's timeline, by IPU id (a new dict; the timelines themselves).

    Raises:
        NotConfiguredError: no IPU system is configured.
    """
    return dict(sorted(_current().items()))


def reset_timelines() -> None:
    """Start every timeline again from zero (e.g. between two measured phases)."""
    with _lock:
        for t in _timelines.values():
            with t._lock:
                t._events.clear()
                t._charged.clear()
                t.now_s = 0.0


def charge_collective(modelled_s: float, label: str) -> None:
    """The hook collectives call once per collective call (from the thread that executes it,
    while every local replica waits in the call): every IPU of every local replica first
    waits for the latest of them (BSP sync), then spends ``modelled_s`` in a
    ``"collective"`` event. Replicas of other instances are charged by their own instance.
    Does nothing when no IPU system is configured. (On every collective's path: kept to a
    few microseconds.)
    """
    system = _system_mod._system
    if system is None:
        return
    if _owner is not system:
        _current()
    mine = _local
    if len(mine) == 1:  # one IPU: nothing to wait for (the common case of one replica)
        t = mine[0]
        with t._lock:
            t._charged.append((t.now_s, modelled_s, label))  # (an Event when read: _fold)
            t.now_s += modelled_s
        return
    if not mine:
        return
    start = max([t.now_s for t in mine])
    event = Event(start, float(modelled_s), "collective", label)
    end = event.end_s
    for t in mine:
        with t._lock:
            t._fold()
            if start > t.now_s:
                t._events.append(Event(t.now_s, start - t.now_s, "sync", "sync"))
            t._events.append(event)
            if end > t.now_s:
                t.now_s = end


class BSPStep(NamedTuple):
    """A laid-out step (modelled seconds).

    Attributes:
        events: per IPU id, its events of the step in time order.
        compute_end_s: when the slowest IPU finished computing (the exchange starts).
        end_s: when the step ends (the longest transfer's end, or ``compute_end_s``).
    """

    events: dict[int, list[Event]]
    compute_end_s: float
    end_s: float


def bsp_step(start_s: float, passes: Iterable[Sequence], ipus: Iterable[int], *,
             sync: bool = False) -> BSPStep:
    """Lay out one step starting at ``start_s``.

    Args:
        passes: ``(ipu, compute_s, label, stage, micro_batch, copies)`` in the order the
            step runs them; ``copies`` is ``[(dst, seconds)]`` with ``dst`` an IPU id
            (a ``"copy"`` event, ``peer`` = dst) or None (``"host_io"``); zero seconds make
            no event.
        ipus: every IPU of the step (those without passes get no event but a sync).
        sync: also give every IPU ``"sync"`` events where it waits: for the slowest IPU's
            compute and for the end of the exchange, so that its events cover
            ``[start_s, end_s]``. (The transfers of one IPU overlap: they run at once.)
    """
    passes = list(passes)
    cursor = {i: start_s for i in ipus}
    events: dict[int, list[Event]] = {i: [] for i in cursor}
    for ipu, compute_s, label, stage, m, _ in passes:
        if compute_s:
            events[ipu].append(Event(cursor[ipu], compute_s, "compute", label, stage, m))
            cursor[ipu] += compute_s
    exchange = max(cursor.values(), default=start_s)
    if sync:
        for ipu, at in cursor.items():
            if at < exchange:
                events[ipu].append(Event(at, exchange - at, "sync", "sync"))
    end = exchange
    for ipu, _, label, stage, m, copies in passes:
        for dst, seconds in copies:
            if seconds:
                events[ipu].append(Event(exchange, seconds, "copy" if dst is not None
                                         else "host_io", label, stage, m, dst))
                end = max(end, exchange + seconds)
    if sync:
        for ipu, evs in events.items():
            last = max((e.start_s + e.duration_s for e in evs), default=start_s)
            if last < end:
                evs.append(Event(last, end - last, "sync", "sync"))
    return BSPStep(events, exchange, end)
