"""The lock files of :mod:`ipu_node.runtime.occupancy`: one per IPU, and what they say.

The primitives the occupancy is made of: the private directories the lock files live in
(:func:`private_dir`), a lock file opened without following symlinks, who holds one
(:class:`Holder`, read from the file and checked against the kernel's table of flocks,
``/proc/locks``), and the IPUs this process holds (:class:`Lease`). Which partition a file is
in and how a set of IPUs is taken is :class:`~ipu_node.runtime.occupancy.Occupancy`'s.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
from dataclasses import dataclass
from typing import Iterable

from ipu_node.errors import OccupancyDirError

__all__ = ["Holder", "Lease", "command_line", "holds_lock", "locked_inodes", "names_file",
           "open_lock_file", "pid_alive", "private_dir", "read_holder"]

_VARIABLE = {"IPU lock directory": " (IPUPOD_OCCUPANCY_DIR)"}


def private_dir(path: str, what: str = "IPU lock directory") -> str:
    """Create ``path`` and its missing parents with mode 0700, or check the existing
    directory: not a symlink, owned by this user, not writable by group or others (an
    existing directory readable by others, e.g. one made by an older ipupod or a test's
    temporary directory, is accepted: the lock files in it are 0600 and O_NOFOLLOW).

    Raises:
        OccupancyDirError: it cannot be created or fails a check (names ``what``, the
            path and why).
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise OccupancyDirError(f"cannot create the {what} {path}"
                                f"{_VARIABLE.get(what, '')}: {exc.strerror}") from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise OccupancyDirError(f"cannot use the {what} {path}: "
                                f"{exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OccupancyDirError(f"the {what} {path} is not a directory (a "
                                "symlink or file is in its place); refusing to use it")
    if st.st_uid != os.getuid():
        hint = " (set IPUPOD_OCCUPANCY_DIR to a directory of your own)" \
            if what in _VARIABLE else ""
        raise OccupancyDirError(f"the {what} {path} belongs to uid {st.st_uid}, not to this "
                                f"user (uid {os.getuid()}); refusing to use it{hint}")
    if st.st_mode & 0o022:
        raise OccupancyDirError(f"the {what} {path} is writable by other users "
                                f"(mode {stat.S_IMODE(st.st_mode):o}); use a 0700 directory")
    return path


@dataclass(frozen=True)
class Holder:
    """Who holds an IPU, as written into its lock file.

    Attributes:
        ipu_id: the IPU.
        pid: holder process id.
        command: holder's command line.
        user: holder's user name.
        attached_at: when it attached (seconds since the epoch, wall clock).
        scope: the partition (``machine`` or ``job-<id>``).
        device: the TF device and gc-info id it attached, e.g. ``/device:IPU:0 (24)``.
    """

    ipu_id: int
    pid: int
    command: str
    user: str
    attached_at: float
    scope: str
    device: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command}, user {self.user}, partition {self.scope})"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def locked_inodes() -> set[tuple[int, int]] | None:
    """(device, inode) of every file some process holds an flock on, from the kernel's own
    table (/proc/locks), or None where it cannot be read. Unlike a pid check, this is not
    fooled by a dead holder's pid being reused."""
    try:
        with open("/proc/locks") as f:
            lines = f.readlines()
    except OSError:
        return None
    held = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK":
            major, minor, inode = fields[5].split(":")
            held.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
    return held


def read_holder(path: str, ipu_id: int, scope: str,
                 held: set[tuple[int, int]] | None = None) -> Holder | None:
    """Who holds ``path`` according to its contents; None when nobody does (``held``: the
    locked files from :func:`locked_inodes`; without it the holder's pid is checked)."""
    if held is not None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if (st.st_dev, st.st_ino) not in held:
            return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not pid_alive(int(data.get("pid", 0)) or -1):
        return None
    return Holder(ipu_id, int(data["pid"]), str(data.get("command", "?")),
                  str(data.get("user", "?")), float(data.get("attached_at", 0.0)), scope,
                  str(data.get("device", "")))


def names_file(path: str, fd: int) -> bool:
    """Whether ``path`` names the file open as ``fd`` (not unlinked or replaced)."""
    try:
        st, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def holds_lock(directory: str, held: set[tuple[int, int]]) -> bool:
    """Whether some process holds an flock on a file in ``directory``."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return False
    for entry in entries:
        try:
            st = os.lstat(os.path.join(directory, entry))
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in held:
            return True
    return False


def open_lock_file(path: str) -> int:
    """Open (creating, 0600) a lock file, never through a symlink; refuse one that is not a
    regular file of this user.

    Raises:
        OccupancyDirError: a symlink or a foreign/odd file is in its place.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OccupancyDirError(f"the IPU lock file {path} is a symlink; refusing to "
                                    "follow it") from None
        raise OccupancyDirError(f"cannot open the IPU lock file {path}: {exc.strerror}") \
            from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise OccupancyDirError(f"the IPU lock file {path} is not a regular file of this "
                                f"user (uid {st.st_uid}); refusing to use it")
    return fd


def command_line() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            parts = f.read().split(b"\0")
        return " ".join(p.decode(errors="replace") for p in parts if p)[:200]
    except OSError:
        return " ".join([sys.executable] + sys.argv)[:200]


class Lease:
    """IPUs held by this process; :meth:`release` gives them back (idempotent)."""

    def __init__(self, fds: dict[int, int], paths: dict[int, str] | None = None):
        self._fds = dict(fds)
        self._paths = dict(paths or {})

    @classmethod
    def combine(cls, leases: Iterable["Lease"]) -> "Lease":
        """One lease holding the IPUs of ``leases`` (which are left empty)."""
        fds: dict[int, int] = {}
        paths: dict[int, str] = {}
        for lease in leases:
            fds.update(lease._fds)
            paths.update(lease._paths)
            lease._fds, lease._paths = {}, {}
        return cls(fds, paths)

    @property
    def ipus(self) -> tuple[int, ...]:
        return tuple(sorted(self._fds))

    def write_holder_info(self, info_by_ipu: dict[int, dict]) -> None:
        for ipu_id, fd in self._fds.items():
            data = json.dumps(info_by_ipu.get(ipu_id, {})).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def release(self) -> None:
        fds, self._fds = self._fds, {}
        paths, self._paths = self._paths, {}
        for ipu_id, fd in fds.items():
            try:
                os.ftruncate(fd, 0)
                if ipu_id in paths and names_file(paths[ipu_id], fd):
                    os.unlink(paths[ipu_id])   # still locked: no new holder can have it
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
