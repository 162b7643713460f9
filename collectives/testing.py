"""A conformance suite for transports: one test body for the local, MPI and gRPC
communicators (the contract of :mod:`collectives.transports.base`).

Run :func:`check_communicator` on every instance of a job at the same time (one process per
instance under ``poprun``/``mpirun``, or one thread per instance when the transports of a job
live in one process, as the gRPC tests do)::

    from collectives.testing import check_communicator
    passed = check_communicator(transport)      # on every instance, same arguments

It raises ``AssertionError`` naming the check, the communicator and the member on the first
result that breaks the contract, and returns the names of the checks that passed. The checks:

* ``agree``: equal fingerprints agree, different ones disagree, the same answer on every
  member, and the communicator stays usable after a disagreement (a mismatch); the same
  with ``agree_gather``, whose payloads (when the transport carries them) arrive whole, in
  member order, at every length up to ``EAGER_MAX_BYTES``; and with
  ``eager_index_exchange``, each member's piece for each member (also against a member that
  agrees by ``agree_gather`` meanwhile);
* ``zero bytes``: every operation with nothing to move;
* ``uneven counts``: all-gathers and all-to-alls whose members send different byte counts,
  some of them zero;
* ``equal blocks``: ``allgather``, ``alltoall_to``, ``allgatherv_to`` (also of 6 MiB
  pieces), ``allgatherv_into``, ``broadcast`` from every root;
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
from collectives.transports.base import EAGER_MAX_BYTES, Communicator, Transport
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

    def expect(self, name: str, got: np.ndarray, want: np.ndarray) -> None:
        got = np.asarray(got).reshape(-1)
        want = np.asarray(want).reshape(-1)
        if got.dtype != np.uint8 or got.size != want.size or not np.array_equal(got, want):
            raise AssertionError(
                f"{name} over instances {self.comm.members} ({self.where}, member "
                f"{self.comm.rank}): got {got.dtype}[{got.size}] {got[:16].tolist()}..., "
                f"expected uint8[{want.size}] {want[:16].tolist()}...")

    # -- the checks -----------------------------------------------------------------------

    def agree(self) -> None:
        comm, n = self.comm, self.comm.size
        for fingerprint in (0, 12345, (1 << 63) - 1):
            if not comm.agree(fingerprint, self.patience("agree")):
                raise AssertionError(f"agree({fingerprint}) over {comm.members} "
                                     f"({self.where}): equal fingerprints disagreed")
        if n > 1:
            for differing in (1000 + comm.rank, 5 if comm.rank == n - 1 else 6):
                if comm.agree(differing, self.patience("agree")):
                    raise AssertionError(f"agree over {comm.members} ({self.where}): "
                                         f"member {comm.rank}'s {differing} agreed with the "
                                         "others' different fingerprints")
        if not comm.agree(77, self.patience("agree")):  # still usable after a mismatch
            raise AssertionError(f"agree over {comm.members} ({self.where}): unusable after "
                                 "a disagreement")
        self.agree_gather()
        self.index_exchange()

    def agree_gather(self) -> None:
        """``agree_gather``: the agreement as :meth:`agree`, with every member's payload
        (lengths differ, zero and EAGER_MAX_BYTES included) when the transport carries
        them; None without payload or after a disagreement."""
        comm, n, me = self.comm, self.comm.size, self.comm.rank
        for name, length in (("uneven", lambda j: 3 * j + 1),
                             ("the largest", lambda j: EAGER_MAX_BYTES if j == 0 else 0)):
            agreed, blocks = comm.agree_gather(
                4242, _bytes(me, length(me), salt=1), self.patience("agree_gather"))
            if not agreed:
                raise AssertionError(f"agree_gather over {comm.members} ({self.where}): "
                                     "equal fingerprints disagreed")
            if blocks is not None:
                if len(blocks) != n:
                    raise AssertionError(f"agree_gather over {comm.members} ({self.where}): "
                                         f"{len(blocks)} blocks for {n} members")
                for j, block in enumerate(blocks):
                    self.expect(f"agree_gather of {name} payloads, member {j}'s", block,
                                _bytes(j, length(j), salt=1))
        agreed, blocks = comm.agree_gather(99, None, self.patience("agree_gather"))
        if not agreed or blocks is not None:
            raise AssertionError(f"agree_gather without payload over {comm.members} "
                                 f"({self.where}): got {agreed}, {blocks}")
        if n > 1:
            agreed, blocks = comm.agree_gather(500 + me, _bytes(me, 8),
                                               self.patience("agree_gather"))
            if agreed or blocks is not None:
                raise AssertionError(f"agree_gather over {comm.members} ({self.where}): "
                                     f"member {me}'s {500 + me} agreed with the others' "
                                     "different fingerprints")

    def index_exchange(self) -> None:
        """``eager_index_exchange``: piece ``j`` of every member's send reaches member
        ``j``, in sender order, at piece sizes on either side of where MPI moves them by
        Bruck's index algorithm, twice each (a reused exchange); a member whose
        fingerprint differs, or who agrees with an ``agree_gather`` meanwhile, makes every
        member disagree, and the exchange works afterwards."""
        comm, n, me = self.comm, self.comm.size, self.comm.rank
        for piece in (1, 12, 1000, 3000, 4100, EAGER_MAX_BYTES // n):
            send, agree = comm.eager_index_exchange(piece)
            for salt in (2, 3):
                send[...] = np.concatenate([_bytes(me, piece, salt=salt * n + j)
                                            for j in range(n)])
                agreed, pieces = agree(7000 + piece, self.patience("eager_index_exchange"))
                if not agreed:
                    raise AssertionError(f"eager_index_exchange over {comm.members} "
                                         f"({self.where}): equal fingerprints disagreed")
                if pieces is None:
                    continue  # (a transport that does not carry payloads)
                for j, got in enumerate(pieces):
                    self.expect(f"eager_index_exchange of {piece}-byte pieces, member {j}'s",
                                got, _bytes(j, piece, salt=salt * n + me))
            if n == 1:
                continue
            if me == n - 1:  # another fingerprint, then another kind of agreement
                agreed, pieces = agree(1, self.patience("eager_index_exchange"))
                again = comm.agree_gather(2, _bytes(me, piece * n),
                                          self.patience("agree_gather"))[0]
            else:
                agreed, pieces = agree(7000 + piece, self.patience("eager_index_exchange"))
                again = agree(7000 + piece, self.patience("eager_index_exchange"))[0]
            if agreed or pieces is not None or again:
                raise AssertionError(f"eager_index_exchange over {comm.members} "
                                     f"({self.where}): member {me} agreed with a member "
                                     "whose call differed")

    def zero_bytes(self) -> None:
        comm, n, empty = self.comm, self.comm.size, np.empty(0, np.uint8)
        self.expect("allgather of 0 bytes", comm.allgather(empty, self.patience("allgather")),
                    empty)
        self.expect("allgatherv of 0 bytes",
                    comm.allgatherv(empty, [0] * n, self.patience("allgatherv")), empty)
        self.expect("alltoallv of 0 bytes",
                    comm.alltoallv(empty, [0] * n, [0] * n, self.patience("alltoallv")), empty)
        self.expect("broadcast of 0 bytes",
                    comm.broadcast(empty.copy(), 0, self.patience("broadcast")), empty)

    def uneven(self) -> None:
        n = self.comm.size
        # member 0 sends nothing; then large pieces (a transport may move them another way)
        for counts in ([3 * j for j in range(n)], [300_001 * (j % 2) + 3 * j for j in range(n)]):
            self._uneven_allgathers(counts)
        self._uneven_alltoallv()

    def _uneven_allgathers(self, counts: list[int]) -> None:
        comm, me, total = self.comm, self.comm.rank, sum(counts)
        what = f"uneven, {total} bytes"
        want = np.concatenate([_bytes(j, counts[j]) for j in range(comm.size)])
        self.expect(f"allgatherv, {what}", comm.allgatherv(
            _bytes(me, counts[me]), counts, self.patience("allgatherv")), want)
        recv = np.zeros(total, np.uint8)
        start = sum(counts[:me])
        recv[start:start + counts[me]] = _bytes(me, counts[me])
        self.expect(f"allgatherv_into, {what}",
                    comm.allgatherv_into(recv, counts, self.patience("allgatherv_into")), want)
        out = np.zeros(total, np.uint8)
        self.expect(f"allgatherv_to, {what}",
                    comm.allgatherv_to(_bytes(me, counts[me]), out, counts,
                                       self.patience("allgatherv_to")), want)

    def _uneven_alltoallv(self) -> None:
        comm, n, me = self.comm, self.comm.size, self.comm.rank

        # member i sends (i + 2j) % 3 bytes to member j (zeros included)
        def count(i: int, j: int) -> int:
            return (i + 2 * j) % 3

        send_counts = [count(me, j) for j in range(n)]
        recv_counts = [count(i, me) for i in range(n)]
        send = np.concatenate([_bytes(me, send_counts[j], salt=j) for j in range(n)])
        want = np.concatenate([_bytes(i, recv_counts[i], salt=me) for i in range(n)])
        self.expect("alltoallv, uneven",
                    comm.alltoallv(send, send_counts, recv_counts, self.patience("alltoallv")),
                    want)
        scratch = np.zeros(sum(recv_counts) + 5, np.uint8)  # a reused, larger buffer
        got = comm.alltoallv(send, send_counts, recv_counts, self.patience("alltoallv"),
                             scratch)
        self.expect("alltoallv into a scratch buffer", np.asarray(got)[:sum(recv_counts)],
                    want)
        # the same bytes in scattered parts: member j's split after its first byte (a
        # zero-byte part included), received into separate arrays of the same split
        def parts(data: np.ndarray) -> list[np.ndarray]:
            return [data[:1], data[1:1], data[1:]] if data.size else []

        send_parts = [parts(send[sum(send_counts[:j]):sum(send_counts[:j + 1])])
                      for j in range(n)]
        recv_parts = [parts(np.zeros(recv_counts[i], np.uint8)) for i in range(n)]
        comm.alltoallv_parts(send_parts, recv_parts, self.patience("alltoallv_parts"))
        got = np.concatenate([_bytes(me, recv_counts[me], salt=me) if i == me else
                              np.concatenate(recv_parts[i] or [np.zeros(0, np.uint8)])
                              for i in range(n)])
        self.expect("alltoallv_parts, uneven", got, want)

    def equal_blocks(self) -> None:
        comm, n, me = self.comm, self.comm.size, self.comm.rank
        for size in (1, 1000, 100_003):  # the last: large, odd (a transport may change path)
            want = np.stack([_bytes(j, size) for j in range(n)])
            self.expect(f"allgather of {size} bytes",
                        comm.allgather(_bytes(me, size), self.patience("allgather")), want)
            send = np.concatenate([_bytes(me, size, salt=j) for j in range(n)])
            recv = np.zeros(size * n, np.uint8)
            want = np.concatenate([_bytes(i, size, salt=me) for i in range(n)])
            self.expect(f"alltoall_to of {size} bytes a block",
                        comm.alltoall_to(send, recv, self.patience("alltoall_to")), want)
            for root in range(n):
                data = _bytes(me, size) if me == root else np.zeros(size, np.uint8)
                self.expect(f"broadcast of {size} bytes from {root}",
                            comm.broadcast(data, root, self.patience("broadcast")),
                            _bytes(root, size))
        # an all-gather into the caller's result of large pieces (MPI copies its own into
        # the result first from 5 MiB and sends it from there)
        size = (6 << 20) + 3
        want = np.concatenate([_bytes(j, size) for j in range(n)])
        self.expect(f"allgatherv_to of {size} bytes a member",
                    comm.allgatherv_to(_bytes(me, size), np.zeros(size * n, np.uint8),
                                       [size] * n, self.patience("allgatherv_to")), want)

    def all(self) -> list[str]:
        done = []
        for name, check in (("agree", self.agree), ("zero bytes", self.zero_bytes),
                            ("uneven counts", self.uneven), ("equal blocks", self.equal_blocks)):
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
        comm.allgather(np.zeros(8, np.uint8), patience)
    except CollectiveTimeoutError as exc:
        others = [m for m in comm.members if m != comm.members[comm.rank]]
        if f"instances {others}" not in str(exc):
            raise AssertionError(f"the timeout does not name the absent members: {exc}")
        return
    raise AssertionError(f"an all-gather over {comm.members} that only member {comm.rank} "
                         "called returned instead of timing out")
