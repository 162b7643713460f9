"""Patience: how a wait for other replicas warns, gives up, and yields the CPU.

MPICH busy-polls inside blocking calls, and with more instances than cores a waiting rank
would take the CPU the computing ranks need (DESIGN.md, known traps). Waits therefore poll
with a back-off: a short spin, then yields, then sleeps growing to 1 ms.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from collectives.errors import CollectiveTimeoutError
from collectives.options import CollectiveOptions

logger = logging.getLogger("collectives")

_SPIN_S = 0.0005       # poll without yielding for this long (small messages finish here)
_YIELD_S = 0.005       # then yield the CPU between polls for this long
_MAX_SLEEP_S = 0.001   # then sleep between polls, doubling up to this


class Patience:
    """The state of one wait.

    Args:
        what: the collective waited for, for messages (e.g. ``"cross_replica_sum #12"``).
        options: stall warning and timeout, wall seconds.
        missing: returns a description of who has not arrived (e.g. ``"replicas 2, 3"``).
    """

    def __init__(self, what: str, options: CollectiveOptions, missing: Callable[[], str]):
        self.what = what
        self.options = options
        self.missing = missing
        self.start = time.monotonic()
        self._warned = False
        self._sleep = 0.00005

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def check(self) -> None:
        """Warn once past the stall time; raise past the timeout.

        Raises:
            CollectiveTimeoutError: the wait lasted longer than ``options.timeout_s``.
        """
        elapsed = self.elapsed()
        if elapsed >= self.options.timeout_s:
            raise CollectiveTimeoutError(
                f"{self.what}: waited {elapsed:.0f} s for {self.missing()}; giving up "
                f"(timeout {self.options.timeout_s:g} s). The replicas may have diverged: "
                "every replica must call the same collectives in the same order.")
        if not self._warned and elapsed >= self.options.stall_warning_s:
            self._warned = True
            logger.warning(
                "%s: waiting %.1f s for %s. If this persists, some replicas are not calling "
                "this collective (different control flow or data per replica).",
                self.what, elapsed, self.missing())

    def backoff(self) -> None:
        """Yield the CPU before the next poll, longer the longer the wait."""
        elapsed = self.elapsed()
        if elapsed < _SPIN_S:
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
