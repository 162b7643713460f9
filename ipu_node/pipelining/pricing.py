"""The one pricer of a pipeline's modelled time, for every front end.

A front end prices each pass's compute its own way (the numpy pipeline from a stage's
declared FLOPs at the chip's peak, PopTorch and TF from their operations through the
per-operation compute model of :mod:`collectives.performance.compute_model`) and says what
each pass sends where; :class:`PipelinePricer` does the rest, the same for all of them:

* the transfers: IPU to IPU over the route's IPU-Links or GW-Links
  (:func:`ipu_node.hardware.routing.transfer_time_s`), IPU to host over its PCIe link
  (:func:`~ipu_node.hardware.routing.host_transfer_time_s`), each route looked up once;
* the steps: each schedule step is one BSP step (:func:`ipu_node.clock.bsp_step`: every IPU
  computes its passes, then all exchange), one after another;
* the account: the compute phase (sum over steps of the slowest IPU's compute), the exchange
  phase, each IPU's busy seconds and the bubble (the share of the IPUs' compute phases spent
  idle, reference execution-model.md §1.3).

It lays steps in two ways: on the IPUs' live timelines as a run goes (the numpy pipeline,
whose FLOPs may depend on the data: ``keep_events=False``, the caller extends the timelines
with each returned step), or once, from modelled time 0, into :class:`PricedSteps` that are
replayed on a replica's timelines at every step (PopTorch: its counts are fixed at compile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ipu_node import clock as _clock
from ipu_node.clock import BSPStep, Event
from ipu_node.hardware import routing

__all__ = ["PipelinePricer", "PricedSteps"]


@dataclass
class PricedSteps:
    """Events of priced steps laid from modelled time 0, and their account (modelled
    seconds); what :meth:`PipelinePricer.priced` returns, replayed by :meth:`replay`.

    Attributes:
        events: IPU key -> its events in time order (the keys the pricer was given, or the
            ``index`` of :meth:`PipelinePricer.priced`; copy peers stay IPU ids).
        total_s: the length of the steps.
        compute_phase_s: the sum over the steps of their compute phase.
        busy_s: IPU key -> compute seconds.
        exchange_s: the sum over the steps of their exchange phase.
        host_s: seconds of the host steps (:meth:`PipelinePricer.host_step`; not in the
            compute or exchange phase).
    """

    events: dict = field(default_factory=dict)
    total_s: float = 0.0
    compute_phase_s: float = 0.0
    busy_s: dict = field(default_factory=dict)
    exchange_s: float = 0.0
    host_s: float = 0.0

    @property
    def bubble_fraction(self) -> float:
        """``1 - sum busy / (IPUs x compute phase)``: the share of the IPUs' compute phases
        spent idle (0 without compute)."""
        return bubble_fraction(self.busy_s, self.compute_phase_s)

    def replay(self, timelines) -> None:
        """Lay these steps on ``timelines`` (IPU key -> :class:`ipu_node.clock.Timeline`), from
        the latest of their clocks: every one waits until then (a ``"sync"`` event), then
        gets the events shifted there. (The events are read once, at the first replay.)"""
        shifted = self.__dict__.get("_shifted")
        if shifted is None:  # per IPU key: each event's start and its other fields
            shifted = self._shifted = [(k, [(e.start_s, tuple(e)[1:]) for e in evs])
                                       for k, evs in self.events.items()]
        start = max([t.now_s for t in timelines.values()])
        new = tuple.__new__
        for key, events in shifted:
            tl = timelines[key]
            tl.wait_until(start)
            if events:
                moved = [new(Event, (s + start,) + rest) for s, rest in events]
                tl.extend(moved, max([e[0] + e[1] for e in moved]))

def bubble_fraction(busy_s: dict, compute_phase_s: float) -> float:
    """``max(0, 1 - sum(busy_s) / (len(busy_s) x compute_phase_s))``; 0 without a compute
    phase or IPUs."""
    n = len(busy_s)
    if compute_phase_s <= 0 or not n:
        return 0.0
    return max(0.0, 1.0 - sum(busy_s.values()) / (n * compute_phase_s))


class PipelinePricer:
    """Lays a pipeline's steps out in modelled time, one BSP step after another.

    Args:
        model: the modelled POD (:class:`ipu_node.hardware.pod.SystemModel`; links and host
            links); None: transfers cost nothing.
        ipus: the IPU ids of the pipeline (every one takes part in every step).
        start_s: where the first step starts (modelled seconds).
        sync: give every IPU ``"sync"`` events where it waits in a step
            (:func:`ipu_node.clock.bsp_step`), so that its events cover the whole step.
        keep_events: keep the events of the steps for :meth:`priced`.
    """

    def __init__(self, model, ipus: Iterable[int], *, start_s: float = 0.0,
                 sync: bool = False, keep_events: bool = True):
        self.model = model
        self.ipus = list(ipus)
        self.start_s = self.now_s = start_s
        self.sync = sync
        self.keep_events = keep_events
        self.events: dict[int, list[Event]] = {i: [] for i in self.ipus}
        self.busy_s: dict[int, float] = dict.fromkeys(self.ipus, 0.0)
        self.compute_phase_s = 0.0
        self.exchange_s = 0.0
        self.host_s = 0.0
        self._links: dict = {}  # (src, dst or None) -> (latency s, bytes/s)

    # -- transfers ---------------------------------------------------------------------------
    def copy_s(self, src: int, dst: int | None, nbytes: int) -> float:
        """Modelled seconds to move ``nbytes`` bytes from IPU ``src`` to IPU ``dst`` (None:
        its host), as :func:`ipu_node.hardware.routing.transfer_time_s` and
        ``host_transfer_time_s`` price them (route latency plus bytes over the route's
        slowest link); 0 for no bytes, the same IPU, or no model.

        Raises:
            ipu_node.errors.UnknownIPUError: an id is not an IPU of the model.
        """
        if self.model is None or not nbytes or dst == src:
            return 0.0
        link = self._links.get((src, dst))
        if link is None:
            links = ([self.model.host_link(src)] if dst is None
                     else routing.route(self.model, src, dst))
            link = self._links[(src, dst)] = (
                sum(l.latency_s for l in links), min(l.bandwidth_bytes_per_s for l in links))
        return link[0] + int(nbytes) / link[1]

    # -- steps -------------------------------------------------------------------------------
    def step(self, passes: Sequence, *, start_s: float | None = None) -> BSPStep:
        """Lay one schedule step: ``passes`` are ``(ipu, compute_s, label, stage,
        micro_batch, copies)`` in the order the step ran them, ``copies`` ``[(dst IPU id or
        None for the host, seconds)]`` (:func:`ipu_node.clock.bsp_step`).

        Args:
            start_s: where the step starts (default: where the last one ended; a run whose
                timelines moved between steps, by a weight update's collectives, says where).

        Returns:
            the laid-out step (its events per IPU id).
        """
        start = self.now_s if start_s is None else start_s
        laid = _clock.bsp_step(start, passes, self.ipus, sync=self.sync)
        busy = self.busy_s
        for p in passes:
            busy[p[0]] += p[1]
        self.compute_phase_s += laid.compute_end_s - start
        self.exchange_s += laid.end_s - laid.compute_end_s
        self._keep(laid)
        self.now_s = laid.end_s
        return laid

    def host_step(self, passes: Sequence) -> BSPStep:
        """Lay a step of host transfers (a step's input before the pipeline): as
        :meth:`step`, counted in :attr:`host_s` instead of the compute and exchange phases
        and the IPUs' busy seconds."""
        start = self.now_s
        laid = _clock.bsp_step(start, passes, self.ipus, sync=self.sync)
        self.host_s += laid.end_s - start
        self._keep(laid)
        self.now_s = laid.end_s
        return laid

    def _keep(self, laid: BSPStep) -> None:
        if self.keep_events:
            for ipu, events in laid.events.items():
                self.events[ipu].extend(events)

    @property
    def bubble_fraction(self) -> float:
        """The share of the IPUs' compute phases spent idle, over the steps laid so far:
        ``1 - sum busy / (IPUs x compute phase)``."""
        return bubble_fraction(self.busy_s, self.compute_phase_s)

    def priced(self, index: dict[int, int] | None = None) -> PricedSteps:
        """The steps laid so far as :class:`PricedSteps`;
        ``index`` renames the IPU keys (an IPU id -> the replica's IPU index, so that the same
        steps replay on every replica's IPUs)."""
        key = (lambda i: i) if index is None else index.__getitem__
        return PricedSteps(events={key(i): list(evs) for i, evs in self.events.items()},
                           total_s=self.now_s - self.start_s, compute_phase_s=self.compute_phase_s,
                           busy_s={key(i): b for i, b in self.busy_s.items()},
                           exchange_s=self.exchange_s, host_s=self.host_s)
