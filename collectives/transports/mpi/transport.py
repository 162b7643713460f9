"""The MPI transport: mpi4py buffer methods on raw bytes, one communicator per instance set.

Only one thread of an instance calls MPI at a time (the engine's leader). Every call is
nonblocking (``Isend``/``Irecv``, ``Iallgatherv``, ``Ialltoall``, ``Idup``)
and polled with :class:`~collectives.waiting.Patience`, which yields the CPU and turns a
missing peer into a timeout instead of a hang:

* **agreement**: before its data, a call's descriptors are agreed by a dissemination
  all-gather of ``[h, length | payload]`` blocks (``h`` the descriptor's fingerprint),
  ``ceil(log2 P)`` rounds of point-to-point messages
  (:mod:`collectives.transports.mpi.agreement`). A small call (at most ``CARRIED_MAX_BYTES``
  per instance) carries its data in those blocks, so it costs one exchange in all; a large
  one sends its header alone and moves its data afterwards. Whole descriptors are
  exchanged only when the fingerprints differ (to name the difference).
* **data**: the communicator of a set of instances,
  :class:`~collectives.transports.mpi.communicator.MPICommunicator`, moves raw bytes.
* **communicators** are made without a blocking call: the job's own one by ``MPI_Comm_idup``,
  started when the transport is made and waited for (with the timeout) at the first call;
  one of a subset of the instances by ``MPI_Comm_create_group`` only after its members
  have all announced themselves point-to-point (waited for with the timeout), so it never
  waits for a peer that has not arrived.
* **data posted before the agreement**: on a communicator of three or more members, a
  large point-to-point operation may post its receives and sends before its call's
  agreement, under a tag of its own call, withdrawn when the call does not agree
  (:mod:`collectives.transports.mpi.requests`).
* **giving up** (the notices, and the waits that look for them): an instance that times out or fails
  (:meth:`MPITransport.abandon`) sends a notice to every other instance (on ``COMM_WORLD``,
  tag :data:`protos.mpi_notice.TAG`); a peer sees it in its next wait (or at the end of an
  agreement) and raises ``PeerLostError`` naming that instance, so a late instance never
  gets a result for a call its peer gave up on, and a job whose program caught a divergence
  does not wait for the timeout at exit.
* **ending**: an instance whose program has ended (:meth:`MPITransport.program_ended`, at
  interpreter exit before ``atexit``'s handlers) and that still waits
  :data:`ENDED_NOTICE_AFTER_S` later (in the engine's
  end-of-program agreement: some peer is not there) sends the notice
  :data:`protos.mpi_notice.ENDED`. A peer whose own program goes on records it; a wait of
  that peer still incomplete :data:`ENDED_GRACE_S` after it
  saw the notice raises ``PeerLostError`` "instance i ended its program": so a call the
  ended instance never makes on another communicator than the job's (a Horovod call on a
  process set, which the end-of-program agreement does not reach) fails within seconds
  instead of the timeout. As in Horovod, whose
  collectives all fail once a rank has shut down, every collective of the job is then over.
  A peer whose own program has ended too takes the notice as the end of the job. When every
  instance ends together, nobody waits and no notice is sent (MPICH's ``MPI_Finalize`` with
  messages in flight to instances that have finalized can end in a PMI barrier that Hydra
  takes for a failed job); notices still queued are drained before ``MPI_Finalize``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

import numpy as np
from mpi4py import MPI  # (this module is imported only when the MPI transport is created)

from collectives.errors import CollectiveTimeoutError, PeerLostError, TransportError
from collectives.options import CollectiveOptions
from collectives.transports.base import Communicator, Transport
from collectives.transports.mpi.communicator import MPICommunicator
from collectives.transports.mpi.requests import NOTICE_EVERY as _NOTICE_EVERY
from collectives.transports.mpi.requests import POSTED_TAG_MAX, WITHDRAW_S, finished
from collectives.transports.mpi.requests import cancel as _cancel
from collectives.waiting import Patience
from protos import mpi_notice

logger = logging.getLogger(__name__)

__all__ = ["ENDED_GRACE_S", "ENDED_NOTICE_AFTER_S", "NOTICE_BYTES", "MPITransport"]

#: a notice of an instance that gives up or ends its program (protos.mpi_notice)
_TAG_NOTICE = mpi_notice.TAG
#: empty looks that end the draining of notices (MPICH takes one message per look)
_DRAIN_LOOKS = 4
#: bytes of a notice: its reason, UTF-8, zero-padded
NOTICE_BYTES = mpi_notice.NBYTES
#: seconds an instance whose program has ended waits (for peers at the end of the job)
#: before it tells them it has ended (protos.mpi_notice)
ENDED_NOTICE_AFTER_S = mpi_notice.ENDED_AFTER_S
#: seconds a wait goes on after it saw that a peer ended its program, before it raises:
#: ipupod assumption, far longer than what the peer sent before it ended takes to arrive
#: (its sends were complete), short enough that the job ends within seconds
ENDED_GRACE_S = 1.0


#: members of a new sub-communicator announce themselves under this tag (job's communicator)
_TAG_CREATE = 0x1A14
#: ... and MPI_Comm_create_group runs under this one
_TAG_CREATE_GROUP = 0x1A15
#: seconds a cancelled receive may take to finish cancelling
_WITHDRAW_S = WITHDRAW_S


class MPITransport(Transport):
    """Instances are the ranks of ``MPI.COMM_WORLD`` (started by poprun's mpirun, or mpirun).

    Args:
        process_index, process_count: this instance and the job size.
        options: timeouts (wall seconds); default: from the environment
            (:meth:`CollectiveOptions.from_env`).

    Raises:
        TransportError: the MPI world does not match the job (size or rank differ from
            ``process_count``/``process_index``).
    """

    def __init__(self, process_index: int, process_count: int,
                 options: CollectiveOptions | None = None):
        world = MPI.COMM_WORLD
        if world.Get_size() != process_count or world.Get_rank() != process_index:
            raise TransportError(
                f"this instance is {process_index} of {process_count}, but the MPI world has "
                f"rank {world.Get_rank()} of {world.Get_size()}: start the program with "
                f"poprun (or mpirun -n {process_count})")
        self.process_index, self.process_count = process_index, process_count
        self.options = options or CollectiveOptions.from_env()
        self._world = world
        # The job's communicator, duplicated without waiting: the first call waits for it with
        # its patience (a peer that is late times out there).
        self._job, self._job_ready = world.Idup()
        # Notices of instances that give up come on COMM_WORLD itself.
        self._listen_for_notices(world)
        atexit.register(self._stop_listening)  # (before mpi4py's MPI_Finalize: LIFO)
        _at_program_end(self.program_ended)
        self._comms: dict[tuple[int, ...], MPICommunicator] = {}
        # whether MPI_TAG_UB reaches the tags of data posted before an agreement (mpi.requests)
        self._posted_tags = world.Get_attr(MPI.TAG_UB) >= POSTED_TAG_MAX
        #: (requests, buffers) of data posted before the agreement of calls that did not
        #: agree (Messages.withdraw), kept until they finish (sweep_orphans) or the end
        self.orphans: list = []

    def sweep_orphans(self) -> None:
        """Drop the :attr:`orphans` whose requests have all finished."""
        self.orphans = [(pending, buffers) for pending, buffers in self.orphans
                        if not all([finished(r) for r in pending])]

    def _listen_for_notices(self, world) -> None:
        """Start listening for the notices of the other instances on ``world``."""
        # Notices of instances that give up come on COMM_WORLD itself (it exists from the
        # start, so even an instance that never reached a communicator can be told), under
        # the reserved tag _TAG_NOTICE.
        self._notice = np.zeros(NOTICE_BYTES, np.uint8)
        self._notice_request = world.Recv_init([self._notice, MPI.BYTE], MPI.ANY_SOURCE,
                                               _TAG_NOTICE)
        self._notice_request.Start()
        self._notice_status = MPI.Status()
        self._lost: PeerLostError | None = None
        self._gave_up = False
        self._notices_sent: list = []  # (requests, buffer): kept alive until the end
        #: peers whose program has ended -> when this instance first saw their notice
        self._ended: dict[int, float] = {}
        #: when this instance's program ended (None: it runs); whether it told the others
        self._program_ended: float | None = None
        self._told_ended = False

    # -- waiting ----------------------------------------------------------------------------

    def wait(self, request, patience: Patience) -> None:
        """Poll ``request`` until done, backing off with ``patience``; every
        :data:`_NOTICE_EVERY` polls look for a notice of a peer that gave up.

        Raises:
            CollectiveTimeoutError: past the patience's timeout (the others are told).
            PeerLostError: a peer gave up (:meth:`abandon`).
        """
        self.wait_all([request], patience)

    def wait_all(self, requests: list, patience: Patience) -> None:
        """:meth:`wait` for every one of ``requests``."""
        polls, testall = 0, MPI.Request.Testall
        try:
            while not testall(requests):
                polls += 1
                if not polls % _NOTICE_EVERY:
                    self.check_notices()
                patience.backoff()
        except CollectiveTimeoutError as exc:
            self.abandon(f"timed out: {exc}")
            raise

    # -- notices of instances that give up ------------------------------------------------

    def check_notices(self, polls: int = 1) -> None:
        """Raise if another instance gave up (sent a notice, :meth:`abandon`). Each of up to
        ``polls`` looks lets MPI's progress engine take one more message off the queue
        (where a peer's notice may wait behind its earlier messages).

        Raises:
            PeerLostError: names the instance and its reason.
        """
        if self._lost is not None:
            raise self._lost
        request = self._notice_request
        if request is None:
            return
        if self._program_ended is not None and not self._told_ended:
            self._tell_ended()
        status = self._notice_status
        for _ in range(polls):
            if request.Test(status):
                break
        else:
            return self._check_ended()
        source = status.Get_source()
        reason = mpi_notice.decode(self._notice)
        if reason == mpi_notice.ENDED:
            self._ended.setdefault(source, time.monotonic())
            request.Start()  # (listen for the next notice)
            return self._check_ended()
        self._lost = PeerLostError(
            f"instance {source} gave up on the job's collectives ({reason}); this "
            f"instance stops too (IPUPOD_COLLECTIVE_TIMEOUT_S is "
            f"{self.options.timeout_s:g} s)", source)
        raise self._lost

    def _check_ended(self) -> None:
        """Raise when a peer ended its program :data:`ENDED_GRACE_S` or more ago (as this
        instance saw it) and this instance's program goes on."""
        if not self._ended or self._program_ended is not None:
            return
        source, seen = min(self._ended.items(), key=lambda item: item[1])
        if time.monotonic() - seen < ENDED_GRACE_S:
            return
        self._lost = PeerLostError.program_ended(source)
        raise self._lost

    def program_ended(self) -> None:
        """This instance's program has ended (called at interpreter exit, before ``atexit``'s
        handlers): from now on the notice of a peer that ended is the normal end of the
        job, and a wait that lasts :data:`ENDED_NOTICE_AFTER_S` tells the others that this
        instance has ended (:data:`protos.mpi_notice.ENDED`). Once."""
        if self._program_ended is None:
            self._program_ended = time.monotonic()

    def _tell_ended(self) -> None:
        """Send the notice :data:`protos.mpi_notice.ENDED` once this instance's program has
        ended :data:`ENDED_NOTICE_AFTER_S` ago (and it has not given up: then they know)."""
        if time.monotonic() - self._program_ended < ENDED_NOTICE_AFTER_S:
            return
        self._told_ended = True
        if not self._gave_up:
            self._send_notice(mpi_notice.ENDED)

    def abandon(self, reason: str) -> None:
        """Send a notice to every other instance: this one gives up (best effort, once,
        without waiting; a notice that cannot go yet is dropped)."""
        if self._gave_up or self.process_count == 1:
            return
        self._gave_up = True
        self._send_notice(reason)

    def _send_notice(self, reason: str) -> None:
        """Send ``reason`` to every other instance, without waiting (best effort)."""
        if self.process_count == 1:
            return
        try:
            buffer = mpi_notice.encode(reason)
            requests = [self._world.Isend([buffer, MPI.BYTE], j, _TAG_NOTICE)
                        for j in range(self.process_count) if j != self.process_index]
            self._notices_sent.append((requests, buffer))
        except MPI.Exception:  # the job is ending anyway
            logger.debug("sending a notice failed", exc_info=True)

    def _drain_notices(self) -> None:
        """Take the notices still queued for this instance, and let this instance's own
        leave (briefly), so that none is in flight at ``MPI_Finalize`` (see the module
        docstring); best effort."""
        request, empty = self._notice_request, 0
        try:
            while request is not None and empty < _DRAIN_LOOKS:
                if request.Test():
                    request.Start()
                    empty = 0
                else:
                    empty += 1
            deadline = time.monotonic() + WITHDRAW_S
            sent = [r for requests, _ in self._notices_sent for r in requests]
            while sent and not MPI.Request.Testall(sent) and time.monotonic() < deadline:
                time.sleep(0.001)
        except MPI.Exception:  # the job is ending
            logger.debug("draining the notices failed", exc_info=True)

    # -- communicators ------------------------------------------------------------------------

    def communicator(self, members: tuple[int, ...]) -> Communicator:
        comm = self._comms.get(members)
        if comm is None:
            if self.process_index not in members:
                raise ValueError(f"instance {self.process_index} is not in {members}")
            if members == tuple(range(self.process_count)):
                make = self._job_communicator
            else:
                def make(patience: Patience, members=members):
                    return self._sub_communicator(members, patience)
            comm = self._comms[members] = MPICommunicator(self, members, make,
                                                          self._posted_tags)
        return comm

    def _job_communicator(self, patience: Patience):
        """The duplicate of COMM_WORLD, once its ``MPI_Comm_idup`` is complete."""
        self.check_notices()
        if self._job_ready is not None:
            self.wait(self._job_ready, patience)
            self._job_ready = None
        return self._job

    def _sub_communicator(self, members: tuple[int, ...], patience: Patience):
        """A communicator of ``members`` made by ``MPI_Comm_create_group`` (collective over
        the members only, MPI-3), which blocks until every member calls it: the members
        first announce themselves to each other point-to-point (waited for with
        ``patience``, naming who is missing), so it is called only once all are there."""
        job = self._job_communicator(patience)
        me = self.process_index
        others = [m for m in members if m != me]
        hello = np.zeros(len(others), np.uint8)
        recvs = [job.Irecv([hello[i:i + 1], MPI.BYTE], m, _TAG_CREATE)
                 for i, m in enumerate(others)]
        sends = [job.Isend([hello[:0], MPI.BYTE], m, _TAG_CREATE) for m in others]
        polls = 0
        try:
            while not MPI.Request.Testall(recvs):
                polls += 1
                if not polls % _NOTICE_EVERY:
                    patience.waiting_for([m for m, r in zip(others, recvs) if not r.Test()])
                    self.check_notices()
                patience.backoff()
            self.wait_all(sends, patience)
        except BaseException as exc:
            for r in [*recvs, *sends]:
                _cancel(r)
            if isinstance(exc, CollectiveTimeoutError):
                self.abandon(f"timed out making the communicator of instances {members}")
            raise
        return job.Create_group(job.Get_group().Incl(list(members)), _TAG_CREATE_GROUP)

    def _stop_listening(self) -> None:
        """Withdraw the receives of notices and presence messages (MPI_Finalize would
        report them as leaked)."""
        atexit.unregister(self._stop_listening)
        self._drain_notices()
        requests = [self._notice_request] + [c.take_listener()
                                             for c in self._comms.values()]
        self._notice_request = None
        for request in requests:
            if request is not None:
                _withdraw(request)

    def close(self) -> None:
        for comm in self._comms.values():
            if comm._comm is not None and comm._comm != self._job:
                _free(comm._comm)
        self._comms.clear()
        self._stop_listening()
        # (the duplicates of COMM_WORLD are left to MPI_Finalize: freeing one whose Idup a
        # peer never joined would wait for that peer)


def _at_program_end(hook) -> None:
    """Run ``hook`` when the program ends: at interpreter exit before ``atexit``'s handlers
    (``threading``'s exit hooks run first, as ``concurrent.futures`` uses them), so before
    the engine's end-of-program agreement, which may wait for the others; else (no such
    hook in this Python) among ``atexit``'s handlers."""
    register = getattr(threading, "_register_atexit", None)
    try:
        register(hook)
    except (TypeError, RuntimeError):  # (absent, or the interpreter is exiting already)
        atexit.register(hook)


def _withdraw(request) -> None:
    """Cancel a pending receive, wait briefly for the cancel, free it (best effort)."""
    _cancel(request)
    deadline = time.monotonic() + _WITHDRAW_S
    try:
        while not request.Test() and time.monotonic() < deadline:
            pass
        request.Free()
    except MPI.Exception:  # the job is ending
        logger.debug("withdrawing a receive failed", exc_info=True)


def _free(comm) -> None:
    try:
        comm.Free()
    except Exception:  # noqa: BLE001 - best effort at shutdown
        logger.debug("freeing a communicator failed", exc_info=True)
