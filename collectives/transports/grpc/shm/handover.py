"""The hand-over of a same-host ring (``channel.py``) from its sender to its receiver.

The memfd and the ring's two eventfds (records written, records released)
travel over a Unix socket (``SCM_RIGHTS``), never as a ``/proc/<pid>/fd/<fd>`` path that a
receiver would open for any pid and fd it is told. The
sender listens at ``ring-<pid>-<nonce>.sock`` in ``<tmp>/ipupod-shm-<uid>`` (0700, owner
checked: only the user can enter); the receiver connects there, checks with ``SO_PEERCRED``
that the peer is the offering process of its own user, and sends the job token; the sender
checks the peer's uid and the token, then sends the fds and the nonce. "Same host" is
verified, not assumed: equal host ids are the precondition, and the receiver then checks the
16-byte nonce from the offer, on the socket and at the start of the memory it maps; the
sender uses the ring only once the receiver has written its "attached" mark into that same
memory. Anything short of that (another host or container, a wrong token or user) leaves the
pair on pure gRPC. The sender's fan-out memfd (``fanout.py``), when it has one, travels
as a fourth fd on the same hand-over.

This module holds the socket's two ends: :class:`HandoverSocket` (the sender's, which hands
the fds to the first peer that proves itself) and :func:`receive_fds` (the receiver's);
checking the nonce in the mapped memory and the attached mark is the ring's
(``channel.py``).
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import struct
import tempfile
import threading
from typing import Callable

from ipu_node.errors import OccupancyDirError
from ipu_node.runtime.occupancy import private_dir

logger = logging.getLogger(__name__)

__all__ = ["HANDOVER_TIMEOUT_S", "HandoverSocket", "receive_fds"]

#: seconds a sender keeps its hand-over socket open for the receiver, and the longest a
#: receiver waits on it
HANDOVER_TIMEOUT_S = 30.0
_TOKEN_BYTES = 1024


def _socket_dir() -> str:
    """This user's private directory of hand-over sockets (created 0700, owner-checked)."""
    return private_dir(os.path.join(tempfile.gettempdir(), f"ipupod-shm-{os.getuid()}"),
                       what="shared-memory socket directory")


def _socket_path(directory: str, pid: int, nonce: bytes) -> str:
    return os.path.join(directory, f"ring-{pid}-{nonce.hex()}.sock")


def _peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid


def _remove_stale_sockets(directory: str) -> None:
    """Hand-over sockets of senders that are gone (SIGKILLed before they removed them)."""
    for name in os.listdir(directory):
        pid = name.split("-")[1] if name.startswith("ring-") else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


class HandoverSocket:
    """The sender's end: a socket listening (for :data:`HANDOVER_TIMEOUT_S`) at
    ``ring-<pid>-<nonce>.sock`` in this user's socket directory, for the one receiver that
    proves the job ``token`` (bytes).

    Raises:
        OSError: the socket cannot be bound, or the socket directory is unsafe.
    """

    def __init__(self, nonce: bytes, token: bytes):
        self._nonce, self._token = nonce, token
        directory = _socket_dir()
        _remove_stale_sockets(directory)
        self._socket_path = _socket_path(directory, os.getpid(), nonce)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(self._socket_path)
            os.chmod(self._socket_path, 0o600)
            listener.listen(4)
            listener.settimeout(HANDOVER_TIMEOUT_S)
        except BaseException:
            listener.close()
            raise
        self._listener = listener

    def start(self, fds: Callable[[], list[int]]) -> None:
        """Hand ``fds()`` (asked once a peer has proved itself) over in a thread of its own,
        which removes the socket when done, refused or timed out."""
        threading.Thread(target=self._hand_over, args=(fds,), name="ipupod-shm-handover",
                         daemon=True).start()

    def _hand_over(self, fds: Callable[[], list[int]]) -> None:
        """Send the fds and the nonce to the first peer of this user that proves the job
        token."""
        listener = self._listener
        try:
            while True:
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(HANDOVER_TIMEOUT_S)
                    _pid, uid = _peer_credentials(conn)
                    given = conn.recv(_TOKEN_BYTES)
                    if uid != os.getuid() or not hmac.compare_digest(given, self._token):
                        logger.warning("refused a shared-memory hand-over to uid %d: wrong "
                                       "user or job token", uid)
                        continue
                    socket.send_fds(conn, [self._nonce], fds())
                    return
        except OSError:   # closed, timed out, or the peer went away: stay on gRPC
            pass
        finally:
            listener.close()
            try:
                os.unlink(self._socket_path)
            except OSError:
                pass

    def close(self) -> None:
        """Stop listening; the hand-over thread ends and removes the socket."""
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()


def receive_fds(pid: int, nonce: bytes, token: str) -> tuple[int, int, int, int | None] | None:
    """The memfd and the two eventfds of the ring that process ``pid`` offered with
    ``nonce``, and the sender's fan-out memfd when it sent one, from that process over its
    hand-over socket (SO_PEERCRED: that pid, this user; then the same nonce back), or None.
    The caller owns the fds."""
    try:
        path = _socket_path(_socket_dir(), pid, nonce)
    except OccupancyDirError as exc:
        logger.warning("no shared memory: %s", exc)
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(HANDOVER_TIMEOUT_S)
        try:
            sock.connect(path)
            peer, uid = _peer_credentials(sock)
            if peer != pid or uid != os.getuid():
                logger.warning("refused the ring of pid %d: its socket belongs to pid %d, "
                               "uid %d", pid, peer, uid)
                return None
            sock.sendall(token.encode())
            message, fds, _flags, _addr = socket.recv_fds(sock, len(nonce), 4)
        except OSError as exc:
            logger.info("cannot receive the ring of process %d (%s): staying on gRPC",
                        pid, exc)
            return None
    if len(fds) not in (3, 4) or message != nonce:
        for fd in fds:
            os.close(fd)
        return None
    return fds[0], fds[1], fds[2], fds[3] if len(fds) == 4 else None
