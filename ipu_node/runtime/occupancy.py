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
import os
import re
import shutil
import time
from typing import Iterable

from ipu_node import env
from ipu_node.errors import IPUBusyError
from ipu_node.runtime._lock_files import (Holder, Lease, command_line, holds_lock,
                                          locked_inodes, names_file, open_lock_file, pid_alive,
                                          private_dir, read_holder)

__all__ = ["Holder", "Lease", "MACHINE_SCOPE", "NAMED_PARTITION_RECORD", "Occupancy",
           "PARTITION_DEVICE", "default_scope", "private_dir", "scope_name"]

MACHINE_SCOPE = "machine"
#: what a launcher writes as the ``device`` of the IPUs it reserves for job ``{job}``
PARTITION_DEVICE = "partition of job {job}"
#: the record of a named partition (``poprun --vipu-partition NAME``) in its scope directory;
#: a scope that has one is kept until ``--remove-partition`` removes it, never reclaimed.
NAMED_PARTITION_RECORD = "partition.json"


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
            fd = open_lock_file(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                holder = read_holder(path, ipu_id, self.scope)
                who = holder.describe() if holder else "another process"
                raise IPUBusyError(f"IPU {ipu_id} is attached by {who}; it is not free") \
                    from None
            if names_file(path, fd):
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
        held = locked_inodes()
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
                stale = not pid_alive(int(scope[9:]))
            else:
                continue
            scope_dir = os.path.join(self.system_dir, scope)
            if os.path.exists(os.path.join(scope_dir, NAMED_PARTITION_RECORD)):
                continue   # a named partition kept on purpose (poprun --remove-partition no)
            if stale and not holds_lock(scope_dir, held):
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
        return {"pid": os.getpid(), "command": command_line(), "user": user,
                "attached_at": time.time(), "device": device}

    def holders(self, all_scopes: bool = True) -> list[Holder]:
        """Attached IPUs of this system (every partition, or only this one), by IPU then scope.

        Reads the lock files without locking them, so it never disturbs an attach; an entry
        whose process is gone (killed) is not listed.
        """
        if not os.path.isdir(self.system_dir):
            return []
        held = locked_inodes()
        scopes = sorted(os.listdir(self.system_dir)) if all_scopes else [self.scope]
        found = []
        for scope in scopes:
            scope_dir = os.path.join(self.system_dir, scope)
            if not os.path.isdir(scope_dir):
                continue
            for entry in os.listdir(scope_dir):
                m = re.fullmatch(r"ipu-(\d+)\.lock", entry)
                if m:
                    holder = read_holder(os.path.join(scope_dir, entry), int(m.group(1)), scope,
                                          held)
                    if holder is not None:
                        found.append(holder)
        return sorted(found, key=lambda h: (h.ipu_id, h.scope))
