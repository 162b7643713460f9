"""Patience: how a wait for other replicas warns, gives up, and yields the CPU.

MPICH busy-polls inside blocking calls, and with more instances than cores a waiting rank
would take the CPU the computing ranks need (DESIGN.md, known traps). Waits therefore poll
nonblocking requests, in one of two modes:

* **arrival** (the default): the peers may be computing for a long time. Poll without
  yielding for ``options.arrival_spin_s`` (0 when the job's instances outnumber the
  cores), then yield the CPU between polls until ``_YIELD_S``, then sleep
  between polls, doubling up to ``_MAX_SLEEP_S``.
* **committed** (``committed=True``): every peer has arrived (the descriptors were
  exchanged) and data is flowing. MPICH moves a large message in pieces, one per poll
  (measured: ~1000 polls for 16 MiB between two ranks), so sleeping between polls would
  slow a transfer by orders of magnitude (1 ms sleeps: 16 MiB in 1.1 s instead of 8 ms).
  Committed waits only yield.

Either way the wait warns after ``stall_warning_s`` and raises after ``timeout_s``, naming
who has not arrived: the ``missing`` callback, helped by :meth:`Patience.waiting_for`, which
a communicator calls with the members whose data it still waits for.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Sequence

from collectives.errors import CollectiveTimeoutError
from collectives.options import CollectiveOptions

logger = logging.getLogger("collectives")

_YIELD_S = 0.005       # then yield the CPU between polls for this long
_MAX_SLEEP_S = 0.001   # then sleep between polls, doubling up to this
_FIRST_SLEEP_S = 0.00005  # (from this)
_CHECK_EVERY = 256     # committed waits look at the clock every this many polls


class Patience:
    """The state of one wait.

    Args:
        what: the collective waited for, for messages (e.g. ``"cross_replica_sum #12"``).
        options: stall warning and timeout, wall seconds.
        missing: returns a description of who has not arrived (e.g. ``"replicas 2, 3"``).
        committed: every peer has arrived; poll by yielding only (see the module docstring).
        name_absent: names the members in :attr:`absent` (e.g. ``"instance 1 (replica 1)"``);
            used in place of ``missing`` once a communicator has reported them.

    Attributes:
        absent: the communicator members (instance indices) whose data has not arrived yet,
            as last reported through :meth:`waiting_for`; None when unknown.
    """

    # (one or two are made per collective call: slots make them cheaper)
    __slots__ = ("what", "options", "missing", "name_absent", "committed", "absent",
                 "start", "_warned", "_sleep", "_polls", "_overlap")

    def __init__(self, what: str, options: CollectiveOptions, missing: Callable[[], str],
                 committed: bool = False,
                 name_absent: Callable[[Sequence[int]], str] | None = None):
        self.what = what
        self.options = options
        self.missing = missing
        self.name_absent = name_absent
        self.committed = committed
        self.restart()

    def restart(self) -> None:
        """Make this a new wait (also a plan's, which reuses its patience from call to call:
        cheaper than a new one)."""
        self.absent: tuple[int, ...] | None = None
        self.start: float | None = None  # the first look at the clock (most waits never look)
        self._warned = False
        self._sleep = _FIRST_SLEEP_S
        self._polls = 0
        self._overlap: Callable[[], None] | None = None

    def elapsed(self) -> float:
        """Seconds since the wait first looked at the clock (its first backoff)."""
        now = time.monotonic()
        if self.start is None:
            self.start = now
        return now - self.start

    def waiting_for(self, members: Sequence[int]) -> None:
        """Called by a communicator: the members whose data has not arrived yet."""
        self.absent = tuple(members)

    def describe_missing(self) -> str:
        """Who has not arrived, for messages."""
        if self.name_absent is not None and self.absent is not None:
            return self.name_absent(self.absent) or "no instance"
        return self.missing()

    def check(self) -> None:
        """Warn once past the stall time; raise past the timeout.

        Raises:
            CollectiveTimeoutError: the wait lasted longer than ``options.timeout_s``.
        """
        elapsed = self.elapsed()
        if elapsed >= self.options.timeout_s:
            raise CollectiveTimeoutError(
                f"{self.what}: waited {elapsed:.0f} s for {self.describe_missing()}; giving up "
                f"(timeout {self.options.timeout_s:g} s). The replicas may have diverged: "
                "every replica must call the same collectives in the same order.")
        if not self._warned and elapsed >= self.options.stall_warning_s:
            self._warned = True
            logger.warning(
                "%s: waiting %.1f s for %s. If this persists, some replicas are not calling "
                "this collective (different control flow or data per replica).",
                self.what, elapsed, self.describe_missing())

    def overlap(self, work: Callable[[], None]) -> None:
        """Run ``work`` (e.g. copying results) while the transfer is in flight: at the first
        :meth:`backoff`, or at :meth:`settle` if the transfer never waited."""
        self._overlap = work

    def settle(self) -> None:
        """Run the :meth:`overlap` work if it has not run yet."""
        work, self._overlap = self._overlap, None
        if work is not None:
            work()

    def backoff(self) -> None:
        """Yield the CPU before the next poll (arrival waits: longer the longer the wait).

        Raises:
            CollectiveTimeoutError: past the timeout.
        """
        if self._overlap is not None:
            self.settle()  # useful work instead of a yield
            return
        if self.committed:
            self._polls += 1
            if self._polls % _CHECK_EVERY == 0:
                self.check()
            os.sched_yield()
            return
        elapsed = self.elapsed()
        if elapsed < self.options.arrival_spin_s:
            return
        if elapsed < _YIELD_S:
            os.sched_yield()
            return
        self.check()
        time.sleep(self._sleep)
        self._sleep = min(self._sleep * 2, _MAX_SLEEP_S)

    def slice_s(self) -> float:
        """How long to block on a condition variable before checking again."""
        return min(1.0, self.options.stall_warning_s, self.options.timeout_s)
