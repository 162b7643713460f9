"""A conformance suite for transports: one test body for the local, MPI and gRPC
communicators (the seam of :mod:`collectives.transports.base`).

Run :func:`check_communicator` on every instance of a job at the same time (one process per
instance under ``poprun``/``mpirun``, or one thread per instance when the transports of a job
live in one process, as the gRPC tests do)::

    from collectives.testing import check_communicator
    passed = check_communicator(transport)      # on every instance, same arguments

It raises ``AssertionError`` naming the check, the communicator and the member on the first
result that breaks the contract, and returns the names of the checks that passed. The checks:

* ``agree``: equal fingerprints agree, different ones disagree, the same answer on every
  member, and the communicator stays usable after a disagreement (a mismatch); where the
  communicator carries payloads (``Capabilities.carries``), the ``gathered`` payloads
  (written into ``send_buffer``) arrive whole, in member order, at every length up to
  ``CARRIED_MAX_BYTES``, and none after a disagreement; where it carries ``indexed`` ones
  (``Capabilities.index_limit_bytes``, the piece sizes ``takes_index`` gives), each
  member's piece for each member, twice (a reused agreement), also against a member that
  agrees with a ``gathered`` carry meanwhile;
* ``zero bytes``: every operation with nothing to move;
* ``uneven counts``: all-gathers (from a send buffer and in place) and all-to-alls whose
  members send different byte counts, some of them zero, small and large (a transport may
  move them another way);
* ``equal blocks``: all-gathers, all-to-alls (into a larger buffer too), ``broadcast``
  from every root, an all-gather of 6 MiB pieces;
* ``handles``: every operation's ``Work``: ``wait`` gives its result, ``test`` is true
  after it; where the communicator posts data before an agreement (``Capabilities.posts``),
  an all-to-all, an all-gather and a broadcast posted under a call's number arrive whole
  after an agreement, and, after a disagreement, withdrawn, leave nothing that the same
  operations of the next call could take;
* ``sub-communicators``: the same checks on the communicators of the first and the second half
  of the instances (each member on its own half), then the job's communicator again;
* ``timeout`` (``timeouts=True``, last, since a transport may stop after one, MPI tells the
  others): instance 0 waits alone in an all-gather and must get ``CollectiveTimeoutError``
  after ``timeout_s``, naming the instances that did not come.

Byte contents are a function of (member, length), so every member can compute what every
other one sent.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from collectives.errors import CollectiveTimeoutError
from collectives.options import CollectiveOptions
from collectives.transports.base import (CARRIED_MAX_BYTES, Carry, Communicator, Transport,
                                         Work, takes_index)
from collectives.waiting import Patience

__all__ = ["check_communicator"]


def _bytes(member: int, n: int, salt: int = 0) -> np.ndarray:
    """The ``n`` bytes that ``member`` sends (``uint8[n]``)."""
    return ((np.arange(n, dtype=np.int64) * (member + 3) + 7 * salt + member) % 251).astype(
        np.uint8)


class _Checks:
    def __init__(self, comm: Communicator, options: CollectiveOptions, where: str):
        self.comm = comm
        self.options = options
        self.where = where

    def patience(self, what: str) -> Patience:
        return Patience(f"conformance {what}", self.options, lambda: "the other members")

    def fail(self, message: str) -> None:
        raise AssertionError(f"{message} over instances {self.comm.members} ({self.where}, "
                             f"member {self.comm.rank})")

    def expect(self, name: str, got: np.ndarray, want: np.ndarray) -> None:
        got = np.asarray(got).reshape(-1)
        want = np.asarray(want).reshape(-1)
        if got.dtype != np.uint8 or got.size != want.size or not np.array_equal(got, want):
            self.fail(f"{name}: got {got.dtype}[{got.size}] {got[:16].tolist()}..., "
                      f"expected uint8[{want.size}] {want[:16].tolist()}...")

    def done(self, name: str, work: Work):
        """``work``'s result, checking that it is a handle that says it is done after."""
        if not isinstance(work, Work):
            self.fail(f"{name} returned {type(work).__name__}, not a Work handle")
        result = work.wait()
        if not work.test():
            self.fail(f"{name}: test() is false after wait()")
        return result

    def agreed(self, fingerprint: int, carry: Carry | None = None,
               payload: np.ndarray | None = None) -> tuple:
        """``agree`` of ``fingerprint``, ``payload`` written into the send buffer first."""
        comm = self.comm
        if carry is not None:
            comm.send_buffer(carry)[...] = payload
        return self.done("agree", comm.agree(fingerprint, self.patience("agree"), carry))

    # -- the checks -----------------------------------------------------------------------

    def agree(self) -> None:
        comm, n = self.comm, self.comm.size
        for fingerprint in (0, 12345, (1 << 63) - 1):
            if self.agreed(fingerprint) != (True, None):
                self.fail(f"agree({fingerprint}): equal fingerprints disagreed")
        if n > 1:
            for differing in (1000 + comm.rank, 5 if comm.rank == n - 1 else 6):
                if self.agreed(differing)[0]:
                    self.fail(f"agree: member {comm.rank}'s {differing} agreed with the "
                              "others' different fingerprints")
        if not self.agreed(77)[0]:  # still usable after a mismatch
            self.fail("agree: unusable after a disagreement")
        if comm.capabilities.carries:
            self.gathered()
        if comm.capabilities.index_limit_bytes:
            self.indexed()

    def gathered(self) -> None:
        """``gathered`` carries: the agreement as without, with every member's payload
        (lengths differ, zero and CARRIED_MAX_BYTES included); None after a
        disagreement."""
        n, me = self.comm.size, self.comm.rank
        for name, length in (("uneven", lambda j: 3 * j + 1),
                             ("the largest", lambda j: CARRIED_MAX_BYTES if j == 0 else 0)):
            carry = Carry.gathered([length(j) for j in range(n)])
            for salt in (1, 2):  # (twice: a reused agreement)
                agreed, blocks = self.agreed(4242 + salt, carry,
                                             _bytes(me, length(me), salt=salt))
                if not agreed or blocks is None or len(blocks) != n:
                    self.fail(f"agree carrying {name} payloads: got {agreed}, "
                              f"{None if blocks is None else len(blocks)} blocks for {n} "
                              "members")
                for j, block in enumerate(blocks):
                    self.expect(f"agree carrying {name} payloads, member {j}'s", block,
                                _bytes(j, length(j), salt=salt))
        if n > 1:
            carry = Carry.gathered([8] * n)
            agreed, blocks = self.agreed(500 + me, carry, _bytes(me, 8))
            if agreed or blocks is not None:
                self.fail(f"agree carrying payloads: member {me}'s {500 + me} agreed with "
                          f"the others' different fingerprints ({agreed}, {blocks})")

    def indexed(self) -> None:
        """``indexed`` carries: piece ``j`` of every member's payload reaches member ``j``,
        in sender order, at the piece sizes the transport takes, twice each (a reused
        agreement); a member whose fingerprint differs, or who agrees with a ``gathered``
        carry meanwhile, makes every member disagree, and the agreement works afterwards."""
        comm, n, me = self.comm, self.comm.size, self.comm.rank
        limit = comm.capabilities.index_limit_bytes
        taken = [p for p in (1, 12, 300, 1000, 1500, 3000, 4100, CARRIED_MAX_BYTES // n)
                 if takes_index(n, p, limit)]
        for piece in taken:
            carry = Carry.indexed(n, piece)
            for salt in (2, 3):
                payload = np.concatenate([_bytes(me, piece, salt=salt * n + j)
                                          for j in range(n)])
                agreed, pieces = self.agreed(7000 + piece, carry, payload)
                if not agreed or pieces is None or len(pieces) != n:
                    self.fail(f"agree carrying {piece}-byte pieces: got {agreed}, {pieces}")
                for j, got in enumerate(pieces):
                    self.expect(f"agree carrying {piece}-byte pieces, member {j}'s", got,
                                _bytes(j, piece, salt=salt * n + me))
            if me == n - 1:  # another fingerprint, then another kind of agreement
                agreed, pieces = self.agreed(1, carry, payload)
                again = self.agreed(2, Carry.gathered([piece * n] * n),
                                    _bytes(me, piece * n))[0]
            else:
                agreed, pieces = self.agreed(7000 + piece, carry, payload)
                again = self.agreed(7000 + piece, carry, payload)[0]
            if agreed or pieces is not None or again:
                self.fail(f"agree carrying {piece}-byte pieces: member {me} agreed with a "
                          "member whose call differed")
        if taken:
            if self.agreed(99) != (True, None):
                self.fail("agree: unusable after indexed agreements that differed")

    def allgatherv(self, name: str, counts: list[int], salt: int = 0) -> None:
        """An all-gather of ``counts`` from a send buffer and in place."""
        comm, me, total = self.comm, self.comm.rank, sum(counts)
        want = np.concatenate([_bytes(j, counts[j], salt) for j in range(comm.size)])
        recv = np.zeros(total, np.uint8)
        self.expect(f"allgatherv, {name}", self.done("allgatherv", comm.allgatherv(
            _bytes(me, counts[me], salt), recv, counts, self.patience("allgatherv"))), want)
        self.expect(f"allgatherv, {name}: into the buffer given", recv, want)
        recv = np.zeros(total, np.uint8)
        start = sum(counts[:me])
        recv[start:start + counts[me]] = _bytes(me, counts[me], salt)
        self.expect(f"allgatherv in place, {name}", self.done("allgatherv", comm.allgatherv(
            None, recv, counts, self.patience("allgatherv"))), want)

    def zero_bytes(self) -> None:
        comm, n, empty = self.comm, self.comm.size, np.empty(0, np.uint8)
        self.allgatherv("of 0 bytes", [0] * n)
        self.expect("alltoallv of 0 bytes", self.done("alltoallv", comm.alltoallv(
            empty, [0] * n, np.empty(0, np.uint8), [0] * n, self.patience("alltoallv"))),
            empty)
        self.expect("broadcast of 0 bytes", self.done("broadcast", comm.broadcast(
            empty.copy(), 0, self.patience("broadcast"))), empty)

    def uneven(self) -> None:
        n = self.comm.size
        # member 0 sends nothing; then large pieces (a transport may move them another way)
        for counts in ([3 * j for j in range(n)], [300_001 * (j % 2) + 3 * j for j in range(n)]):
            self.allgatherv(f"uneven, {sum(counts)} bytes", counts)
        self._uneven_alltoallv()

    def _uneven_alltoallv(self) -> None:
        comm, n, me = self.comm, self.comm.size, self.comm.rank

        # member i sends (i + 2j) % 3 bytes to member j (zeros included)
        def count(i: int, j: int) -> int:
            return (i + 2 * j) % 3

        send_counts = [count(me, j) for j in range(n)]
        recv_counts = [count(i, me) for i in range(n)]
        send = np.concatenate([_bytes(me, send_counts[j], salt=j) for j in range(n)])
        want = np.concatenate([_bytes(i, recv_counts[i], salt=me) for i in range(n)])
        recv = np.zeros(sum(recv_counts), np.uint8)
        self.expect("alltoallv, uneven", self.done("alltoallv", comm.alltoallv(
            send, send_counts, recv, recv_counts, self.patience("alltoallv"))), want)
        scratch = np.zeros(sum(recv_counts) + 5, np.uint8)  # a reused, larger buffer
        got = self.done("alltoallv", comm.alltoallv(send, send_counts, scratch, recv_counts,
                                                    self.patience("alltoallv")))
        self.expect("alltoallv into a larger buffer", got, want)
        self.expect("alltoallv into a larger buffer: in its place", scratch[:want.size], want)

    def equal_blocks(self) -> None:
        comm, n, me = self.comm, self.comm.size, self.comm.rank
        for size in (1, 1000, 100_003):  # the last: large, odd (a transport may change path)
            self.allgatherv(f"equal, {size} bytes a member", [size] * n, salt=size)
            send = np.concatenate([_bytes(me, size, salt=j) for j in range(n)])
            recv = np.zeros(size * n, np.uint8)
            want = np.concatenate([_bytes(i, size, salt=me) for i in range(n)])
            self.expect(f"alltoallv of {size} bytes a block", self.done(
                "alltoallv", comm.alltoallv(send, [size] * n, recv, [size] * n,
                                            self.patience("alltoallv"))), want)
            self.expect(f"alltoallv of {size} bytes a block: into the buffer given", recv,
                        want)
            for root in range(n):
                data = _bytes(me, size) if me == root else np.zeros(size, np.uint8)
                got = self.done("broadcast", comm.broadcast(data, root,
                                                            self.patience("broadcast")))
                self.expect(f"broadcast of {size} bytes from {root}", got, _bytes(root, size))
                self.expect(f"broadcast of {size} bytes from {root}: into the buffer given",
                            data, _bytes(root, size))
        # an all-gather into the caller's result of large pieces (MPI copies its own into
        # the result first from 5 MiB and sends it from there)
        size = (6 << 20) + 3
        want = np.concatenate([_bytes(j, size) for j in range(n)])
        self.expect(f"allgatherv of {size} bytes a member", self.done(
            "allgatherv", comm.allgatherv(_bytes(me, size), np.zeros(size * n, np.uint8),
                                          [size] * n, self.patience("allgatherv"))), want)

    def handles(self) -> None:
        """Operations posted under a call's number before its agreement, where the
        communicator posts: the bytes of an agreed call arrive whole; where member 0 called
        something else (it posts nothing), the others withdraw theirs, and the next calls'
        bytes arrive whole."""
        comm, n, me = self.comm, self.comm.size, self.comm.rank
        if not comm.capabilities.posts:
            return
        size = 300_007  # (large: posted point-to-point)
        for seq, agrees in ((41, True), (42, False), (43, True), (44, True)):
            send = np.concatenate([_bytes(me, size, salt=seq + j) for j in range(n)])
            recv = np.zeros(size * n, np.uint8)
            gathered = np.zeros(size * n, np.uint8)
            data = _bytes(me, size, salt=seq) if me == 0 else np.zeros(size, np.uint8)
            works = [] if not agrees and me == 0 else [
                comm.alltoallv(send, [size] * n, recv, [size] * n,
                               self.patience("alltoallv"), posted=seq),
                comm.allgatherv(_bytes(me, size, salt=seq), gathered, [size] * n,
                                self.patience("allgatherv"), posted=seq),
                comm.broadcast(data, 0, self.patience("broadcast"), posted=seq)]
            agreed = self.agreed(seq if agrees or me else 10_000 + seq)[0]
            if agreed != agrees:
                self.fail(f"posted call {seq}: agreed {agreed}")
            if not agreed:
                for work in works:
                    work.withdraw()
                continue
            names = ("posted alltoallv", "posted allgatherv", "posted broadcast")
            results = [self.done(name, work) for name, work in zip(names, works)]
            self.expect(f"posted alltoallv of call {seq}", results[0], np.concatenate(
                [_bytes(i, size, salt=seq + me) for i in range(n)]))
            self.expect(f"posted allgatherv of call {seq}", results[1], np.concatenate(
                [_bytes(j, size, salt=seq) for j in range(n)]))
            self.expect(f"posted broadcast of call {seq}", results[2],
                        _bytes(0, size, salt=seq))

    def all(self) -> list[str]:
        done = []
        for name, check in (("agree", self.agree), ("zero bytes", self.zero_bytes),
                            ("uneven counts", self.uneven), ("equal blocks", self.equal_blocks),
                            ("handles", self.handles)):
            check()
            done.append(f"{name} over {list(self.comm.members)}")
        return done


def check_communicator(transport: Transport, *, timeout_s: float = 2.0,
                       timeouts: bool = True,
                       log: Callable[[str], None] | None = None) -> list[str]:
    """Run the conformance checks (module docstring) on ``transport``'s communicators.

    Call it on every instance of the job at once, with the same arguments.

    Args:
        transport: this instance's transport (local, MPI, gRPC, or a new one).
        timeout_s: the patience of every wait (wall seconds): a check that hangs fails
            with ``CollectiveTimeoutError`` after it; the timeout check waits this long.
        timeouts: run the timeout check (last; afterwards the transport may be unusable).
        log: called with the name of each check as it passes.

    Returns:
        The names of the checks that passed, in order.

    Raises:
        AssertionError: a result broke the contract (names the check and the member).
        CollectiveTimeoutError: a check did not complete within ``timeout_s``.
    """
    options = CollectiveOptions(stall_warning_s=timeout_s, timeout_s=timeout_s)
    n, me = transport.process_count, transport.process_index
    everyone = tuple(range(n))
    done: list[str] = []

    def run(comm: Communicator, where: str) -> None:
        for name in _Checks(comm, options, where).all():
            done.append(name)
            if log is not None:
                log(name)

    run(transport.communicator(everyone), "the job's communicator")
    if n > 1:
        half = (n + 1) // 2
        mine = everyone[:half] if me < half else everyone[half:]
        run(transport.communicator(mine), "a sub-communicator")
        run(transport.communicator(everyone), "the job's communicator after the others")
    if timeouts and n > 1:
        if me == 0:
            _check_timeout(transport.communicator(everyone), options)
        done.append("timeout")
        if log is not None:
            log("timeout")
    return done


def _check_timeout(comm: Communicator, options: CollectiveOptions) -> None:
    patience = Patience("conformance timeout", options, lambda: "the other members",
                        name_absent=lambda members: f"instances {list(members)}")
    try:
        comm.allgatherv(np.zeros(8, np.uint8), np.zeros(8 * comm.size, np.uint8),
                        [8] * comm.size, patience).wait()
    except CollectiveTimeoutError as exc:
        others = [m for m in comm.members if m != comm.members[comm.rank]]
        if f"instances {others}" not in str(exc):
            raise AssertionError(f"the timeout does not name the absent members: {exc}")
        return
    raise AssertionError(f"an all-gather over {comm.members} that only member {comm.rank} "
                         "called returned instead of timing out")
