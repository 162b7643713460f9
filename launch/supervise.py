"""What every backend does the same way: root cause, signal forwarding, dying with poprun.

Shared by :mod:`launch.mpirun` (one mpirun child) and :mod:`launch.local` (one child per
instance).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import tempfile
import threading
from typing import Callable, Sequence

from launch.errors import InstanceFailure, LaunchError

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
        self.killed = False   # the job outlived the grace period and was killed
        self.previous: dict[int, object] = {}

    def _handler(self, signum, frame):
        first = self.received is None
        self.received = signum
        self.deliver(signum)
        if first:
            timer = threading.Timer(self.grace_s, self._kill)
            timer.daemon = True
            timer.start()

    def _kill(self):
        if self.alive():
            self.killed = True
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


#: prefix of a job's working directory (output and error files) in :func:`runtime_dir`
_WORKDIR_PREFIX = "job-"


def runtime_dir() -> str:
    """This user's private directory for poprun's working files (``<tmp>/poprun-<uid>``),
    created 0700; refused when it is a symlink, not a directory, owned by another user or
    open to others (one line naming it).

    Raises:
        LaunchError: the directory cannot be made private (says what is wrong).
    """
    path = os.path.join(tempfile.gettempdir(), f"poprun-{os.getuid()}")
    return private_dir(path)


def private_dir(path: str) -> str:
    """Create ``path`` (mode 0700) or check an existing one: a real directory (not a
    symlink) owned by this user, with no access for group or others. Returns ``path``.

    Raises:
        LaunchError: otherwise, naming the directory, its owner and mode.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise LaunchError(f"cannot create the directory {path}: {exc.strerror}") from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise LaunchError(f"cannot use the directory {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise LaunchError(f"{path} is not a directory (a symlink or file is in its place); "
                          "remove it")
    if st.st_uid != os.getuid():
        raise LaunchError(f"the directory {path} belongs to uid {st.st_uid}, not to this "
                          f"user (uid {os.getuid()}); refusing to use it")
    if st.st_mode & 0o077:
        raise LaunchError(f"the directory {path} is open to other users (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); it must be 0700")
    return path


def make_workdir() -> str:
    """A fresh working directory for one job, inside :func:`runtime_dir`, named after this
    process (``job-<pid>-<random>``) so that :func:`reclaim_workdirs` can tell when its
    launcher is gone. Reclaims dead launchers' directories first.

    Raises:
        LaunchError: as :func:`runtime_dir`.
    """
    root = runtime_dir()
    reclaim_workdirs(root)
    return tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-", dir=root)


def reclaim_workdirs(root: str) -> list[str]:
    """Remove the working directories in ``root`` whose launcher process is gone (a poprun
    that was SIGKILLed cannot remove its own). Returns the names removed."""
    removed = []
    for name in os.listdir(root):
        pid = name[len(_WORKDIR_PREFIX):].split("-", 1)[0]
        if not name.startswith(_WORKDIR_PREFIX) or not pid.isdigit() \
                or os.path.exists(f"/proc/{pid}"):   # its launcher still runs
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed


def check_program(command: Sequence[str]) -> None:
    """Refuse a command whose program cannot be run, before anything starts.

    Raises:
        LaunchError: the command or its program name is empty, or the program is neither an
            executable file nor found on PATH.
    """
    if not command or not command[0].strip():
        raise LaunchError("no program given: poprun [options] program [args...]")
    program = command[0]
    if os.sep in program:
        if not os.path.isfile(program) or not os.access(program, os.X_OK):
            raise LaunchError(f"the program {program!r} is not an executable file")
    elif shutil.which(program) is None:
        raise LaunchError(f"the program {program!r} was not found on PATH")


def descendants(pid: int) -> list[int]:
    """Process ids of every live descendant of ``pid`` (from /proc; [] where unreadable)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants (those found at the time of the call)."""
    for target in [pid, *descendants(pid)]:
        try:
            os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
