"""Which IPUs are attached, shared by all processes of the machine: one lock file per IPU.

A process attaches IPU ``i`` by holding an exclusive ``fcntl.flock`` on
``<root>/<system>/<scope>/ipu-<i>.lock`` and writes who it is into the file (pid, command line,
user, time, job, device) for ``gc-monitor``. The kernel drops the lock when the process ends in
any way, SIGKILL included, so a killed process frees its IPUs; a clean release empties the file
first and unlinks it while still holding the lock; a new holder checks, once it holds the
lock, that the path still names the file it locked (else it retries), so an unlink never
races with a new holder and nothing is left behind.

``<root>`` is :func:`ipu_node.env.occupancy_dir` (``IPUPOD_OCCUPANCY_DIR`` overrides it).
Every directory on the way is created 0700 and checked (a real directory, owned by this
user, closed to others) and lock files are opened with ``O_NOFOLLOW`` and mode 0600, so
another user who creates ``/tmp/ipupod-<uid>`` first, or plants a symlink in it, is refused
with one line (:class:`~ipu_node.errors.OccupancyDirError`) instead of making ipupod write
into a file of theirs.
``<scope>`` is the partition (:func:`default_scope`):

* ``job-<IPUPOD_JOB_ID>`` for the instances of a launched job (poprun sets the variable): a job
  gets a partition of its own, as poprun gets a V-IPU partition for a job on a real POD, so its
  instances never collide with other jobs or with IPUs the launching process holds;
* ``launcher-<parent pid>`` for an instance of a multi-instance job without a job id (e.g.
  started by a bare ``mpirun``): the instances one launcher started together share a partition;
* ``machine`` for a process started on its own: such processes compete for the machine's IPUs,
  as ``auto_select_ipus`` does on a real server (seed 002:219).
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import json
import os
import re
import shutil
import stat
import sys
import time
from dataclasses import dataclass
from typing import Iterable

from ipu_node import env
from ipu_node.errors import IPUBusyError, OccupancyDirError

MACHINE_SCOPE = "machine"
#: what a launcher writes as the ``device`` of the IPUs it reserves for job ``{job}``
PARTITION_DEVICE = "partition of job {job}"
#: the record of a named partition (``poprun --vipu-partition NAME``) in its scope directory;
#: a scope that has one is kept until ``--remove-partition`` removes it, never reclaimed.
NAMED_PARTITION_RECORD = "partition.json"
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


def scope_name(job_id: str | None) -> str:
    """Directory name of the partition of ``job_id`` (None: the machine's shared scope)."""
    if not job_id:
        return MACHINE_SCOPE
    return "job-" + re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:100]


def default_scope(multi_instance: bool = False) -> str:
    """The partition of this process: its job's, its launcher's, or the machine's (see above)."""
    job = env.job_id()
    if job:
        return scope_name(job)
    if multi_instance:
        return f"launcher-{os.getppid()}"
    return MACHINE_SCOPE


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _locked_inodes() -> set[tuple[int, int]] | None:
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


def _read_holder(path: str, ipu_id: int, scope: str,
                 held: set[tuple[int, int]] | None = None) -> Holder | None:
    """Who holds ``path`` according to its contents; None when nobody does (``held``: the
    locked files from :func:`_locked_inodes`; without it the holder's pid is checked)."""
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
    if not isinstance(data, dict) or not _pid_alive(int(data.get("pid", 0)) or -1):
        return None
    return Holder(ipu_id, int(data["pid"]), str(data.get("command", "?")),
                  str(data.get("user", "?")), float(data.get("attached_at", 0.0)), scope,
                  str(data.get("device", "")))


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` names the file open as ``fd`` (not unlinked or replaced)."""
    try:
        st, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _holds_lock(directory: str, held: set[tuple[int, int]]) -> bool:
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


def _open_lock_file(path: str) -> int:
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


def _command_line() -> str:
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
                if ipu_id in paths and _names(paths[ipu_id], fd):
                    os.unlink(paths[ipu_id])   # still locked: no new holder can have it
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


class Occupancy:
    """The lock files of one system in one partition.

    Args:
        system_name: the system (each has its own IPUs).
        scope: the partition directory name (None: :func:`default_scope` of a single process).
        root: directory of all lock files (None: :func:`ipu_node.env.occupancy_dir`).
    """

    def __init__(self, system_name: str, scope: str | None = None, root: str | None = None):
        self.scope = scope or default_scope()
        self.system_dir = os.path.join(root or env.occupancy_dir(), system_name)
        self.dir = os.path.join(self.system_dir, self.scope)

    def _path(self, ipu_id: int, scope_dir: str | None = None) -> str:
        return os.path.join(scope_dir or self.dir, f"ipu-{ipu_id}.lock")

    def acquire(self, ipus: Iterable[int]) -> Lease:
        """Hold all of ``ipus`` or none of them.

        Raises:
            IPUBusyError: one of them is held by another attachment (names the IPU and holder).
            OSError: the lock directory cannot be created or written.
        """
        self.make_dirs()
        fds: dict[int, int] = {}
        paths = {ipu_id: self._path(ipu_id) for ipu_id in set(ipus)}
        try:
            for ipu_id in sorted(paths):  # one global order: no lock-order inversions
                fds[ipu_id] = self._lock(ipu_id, paths[ipu_id])
        except BaseException:
            Lease(fds, paths).release()
            raise
        return Lease(fds, paths)

    def _lock(self, ipu_id: int, path: str) -> int:
        """An fd of ``path`` holding its exclusive lock, on the file the path names now.

        Raises:
            IPUBusyError: another process holds it (names the holder).
        """
        while True:
            fd = _open_lock_file(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                holder = _read_holder(path, ipu_id, self.scope)
                who = holder.describe() if holder else "another process"
                raise IPUBusyError(f"IPU {ipu_id} is attached by {who}; it is not free") \
                    from None
            if _names(path, fd):
                return fd
            os.close(fd)   # its holder unlinked it while releasing: lock the new one

    def make_dirs(self) -> None:
        """Create (0700) and check the root, system and partition directories.

        Raises:
            OccupancyDirError: one of them is unusable or unsafe (see :func:`private_dir`).
        """
        for path in (os.path.dirname(self.system_dir), self.system_dir, self.dir):
            private_dir(path)

    def reclaim_stale_scopes(self) -> list[str]:
        """Remove the partition directories of this system whose job has ended without
        removing them (its launcher was SIGKILLed): ``job-<id>`` with no live
        :data:`PARTITION_DEVICE` holder in the machine scope, ``launcher-<pid>`` whose pid
        is gone, in both cases with no lock file held. Returns the names removed."""
        held = _locked_inodes()
        if held is None or not os.path.isdir(self.system_dir):
            return []
        machine = Occupancy(os.path.basename(self.system_dir), MACHINE_SCOPE,
                            os.path.dirname(self.system_dir))
        live = {h.device for h in machine.holders(all_scopes=False)}
        removed = []
        for scope in sorted(os.listdir(self.system_dir)):
            if scope.startswith("job-"):
                stale = PARTITION_DEVICE.format(job=scope[4:]) not in live
            elif scope.startswith("launcher-") and scope[9:].isdigit():
                stale = not _pid_alive(int(scope[9:]))
            else:
                continue
            scope_dir = os.path.join(self.system_dir, scope)
            if os.path.exists(os.path.join(scope_dir, NAMED_PARTITION_RECORD)):
                continue   # a named partition kept on purpose (poprun --remove-partition no)
            if stale and not _holds_lock(scope_dir, held):
                shutil.rmtree(scope_dir, ignore_errors=True)
                removed.append(scope)
        return removed

    def discard(self) -> None:
        """Remove this partition's lock files: for a launcher, once its job has ended (no
        instance holds them any more), so that finished jobs leave nothing behind."""
        shutil.rmtree(self.dir, ignore_errors=True)

    def holder_info(self, *, device: str) -> dict:
        """What this process writes into the lock files of the IPUs it attaches."""
        try:
            user = getpass.getuser()
        except Exception:  # no passwd entry (containers)
            user = str(os.getuid())
        return {"pid": os.getpid(), "command": _command_line(), "user": user,
                "attached_at": time.time(), "device": device}

    def holders(self, all_scopes: bool = True) -> list[Holder]:
        """Attached IPUs of this system (every partition, or only this one), by IPU then scope.

        Reads the lock files without locking them, so it never disturbs an attach; an entry
        whose process is gone (killed) is not listed.
        """
        if not os.path.isdir(self.system_dir):
            return []
        held = _locked_inodes()
        scopes = sorted(os.listdir(self.system_dir)) if all_scopes else [self.scope]
        found = []
        for scope in scopes:
            scope_dir = os.path.join(self.system_dir, scope)
            if not os.path.isdir(scope_dir):
                continue
            for entry in os.listdir(scope_dir):
                m = re.fullmatch(r"ipu-(\d+)\.lock", entry)
                if m:
                    holder = _read_holder(os.path.join(scope_dir, entry), int(m.group(1)), scope,
                                          held)
                    if holder is not None:
                        found.append(holder)
        return sorted(found, key=lambda h: (h.ipu_id, h.scope))
