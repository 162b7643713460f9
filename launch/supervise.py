"""What every backend does the same way: root cause, signal forwarding, dying with poprun.

Shared by :mod:`launch.mpirun` (one mpirun child) and :mod:`launch.local` (one child per
instance).
"""

from __future__ import annotations

import ctypes
import signal
import threading
from typing import Callable

from launch.errors import InstanceFailure

#: seconds between forwarding SIGINT/SIGTERM to the job and killing what is left of it
GRACE_PERIOD_S = 5.0
_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """In a child process: get ``signum`` when the parent dies (Linux PR_SET_PDEATHSIG), so
    instances never outlive poprun. A no-op where prctl does not exist."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum))
    except (OSError, AttributeError):
        pass


#: errors that an instance raises because another one failed (never the root cause while
#: another failure is known): a lost peer, an aborted job
CONSEQUENCES = ("PeerLostError", "TransportClosedError")


def root_cause(failures: list[InstanceFailure]) -> InstanceFailure:
    """The failure that came first: the earliest timed one, else the first that was not a
    signal (instances stopped after a failure die by a signal), else the first. Failures
    that are consequences of another (:data:`CONSEQUENCES`, e.g. an instance that lost its
    peer) only count when nothing else is known: the survivors of a SIGKILL notice it before
    the launcher does.

    Raises:
        ValueError: ``failures`` is empty.
    """
    if not failures:
        raise ValueError("no failures to choose a root cause from")
    causes = [f for f in failures if not f.error.startswith(CONSEQUENCES)]
    failures = causes or failures
    timed = [f for f in failures if f.time is not None]
    if timed:
        return min(timed, key=lambda f: f.time)
    return next((f for f in failures if not f.signal), failures[0])


class forward_signals:
    """While the job runs (a ``with`` block): SIGINT/SIGTERM to poprun are passed to the job
    with ``deliver(signum)``; if ``alive()`` is still true :data:`GRACE_PERIOD_S` later,
    ``kill()`` ends it. Only installs handlers in the main thread.

    Args:
        deliver: sends a signal number to the job.
        kill: ends the job at once (SIGKILL).
        alive: whether any part of the job is still running.
        grace_s: seconds between ``deliver`` and ``kill``.
    """

    def __init__(self, deliver: Callable[[int], None], kill: Callable[[], None],
                 alive: Callable[[], bool], grace_s: float = GRACE_PERIOD_S):
        self.deliver, self.kill, self.alive, self.grace_s = deliver, kill, alive, grace_s
        self.received: int | None = None
        self.previous: dict[int, object] = {}

    def _handler(self, signum, frame):
        self.received = signum
        self.deliver(signum)
        timer = threading.Timer(self.grace_s, self._kill)
        timer.daemon = True
        timer.start()

    def _kill(self):
        if self.alive():
            self.kill()

    def __enter__(self) -> "forward_signals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, self._handler)
        return self

    def __exit__(self, *exc) -> bool:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        return False
