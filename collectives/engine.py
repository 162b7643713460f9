"""The collective engine of one instance: local rendezvous, checks, then the algorithm.

Every local replica deposits its contribution for call number ``seq``; the last to arrive
(the leader) checks that all descriptors agree, exchanges the descriptors with the other
instances (so every instance raises on a mismatch instead of waiting, and a stall names the
instances that have not arrived), runs the algorithm (local combine in shared memory,
exchange over the transport) and hands each replica its result. Only the leader touches the
transport, one call at a time.

Divergent control flow is caught three ways:

* a replica that calls a different collective (or the same with other arguments) at the
  same position: the descriptors differ -> ``CollectiveMismatchError`` on every replica;
* a replica that returns from its function (``strategy.run``) while the others wait for it
  in a collective: the waiting replica takes the lead and sends an error descriptor, so
  every instance raises ``CollectiveMismatchError`` naming the replica;
* an instance that ends its program while others still call collectives: at exit it sends
  an "end of program" descriptor (:meth:`CollectiveEngine.finish`), which the others see as
  a mismatch naming it. Anything else (an instance that computes for ever) is a stall
  warning naming the missing instances, then ``CollectiveTimeoutError``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from collectives.accounting import CallRecord, CountingCommunicator, Ledger
from collectives.descriptor import Descriptor
from collectives.errors import (CollectiveAbortedError, CollectiveError,
                                CollectiveMismatchError, CollectiveTimeoutError,
                                TransportError)
from collectives.gcl_options import GCLOptions
from collectives.groups import CommGroup
from collectives.handshake import Handshake
from collectives.options import CollectiveOptions
from collectives.transports.base import Transport
from collectives.waiting import Patience

logger = logging.getLogger("collectives")

#: ``algorithm(engine, descriptor, values) -> results``: values and results per local replica.
Algorithm = Callable[["CollectiveEngine", Descriptor, Sequence[Any]], list]

#: the op of the descriptor an instance sends when its program ends
END_OF_PROGRAM = "end of program"

#: local reductions and result copies of at least this many bytes run in slices on several
#: threads (numpy releases the GIL); slices small enough to stay in the CPU cache
PARALLEL_MIN_BYTES = 1 << 20
_SLICE_BYTES = 128 << 10


class _Text:
    """A message text made when first shown (most waits end without one)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], str]):
        self._make = make

    def __str__(self) -> str:
        return self._make()

    def __format__(self, spec: str) -> str:
        return format(self._make(), spec)


class _Transfer:
    """Who a data wait waits for, for messages."""

    __slots__ = ("instances",)

    def __init__(self, instances: Sequence[int]):
        self.instances = instances

    def __call__(self) -> str:
        return f"instances {list(self.instances)} to finish the transfer"


def _other_instances() -> str:
    return "the other instances"


class _Slot:
    """The rendezvous of the local replicas for one call number."""

    def __init__(self, n: int):
        self.descs: list[Descriptor | None] = [None] * n
        self.values: list[Any] = [None] * n
        self.arrived = 0
        self.picked = 0
        self.leading = False
        self.done = False
        self.results: list | None = None
        self.error: BaseException | None = None
        self.algorithm: Algorithm | None = None
        self.group: CommGroup | None = None


class CollectiveEngine:
    """Runs collectives for the replicas of one instance.

    Args:
        num_replicas: global replication factor.
        num_local_replicas: replicas of this instance.
        replica_index_offset: global index of this instance's first replica.
        transport: how this instance reaches the others.
        options: stall warning and timeout.
        gcl: GCL options (choose the modelled algorithm only).
        ipus_per_replica: IPUs each replica occupies (for the cost model).
    """

    def __init__(self, num_replicas: int, num_local_replicas: int, replica_index_offset: int,
                 transport: Transport, options: CollectiveOptions,
                 gcl: GCLOptions | None = None, ipus_per_replica: int = 1):
        self.num_replicas = num_replicas
        self.num_local_replicas = num_local_replicas
        self.replica_index_offset = replica_index_offset
        self.transport = transport
        self.options = options
        self.gcl = gcl or GCLOptions()
        self.ipus_per_replica = ipus_per_replica
        self.ledger = Ledger()
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._seq = [0] * num_local_replicas
        self._finished_at: list[int | None] = [None] * num_local_replicas
        self._host_seq = 0
        self._failure: BaseException | None = None
        self._comms: dict[tuple[int, ...], CountingCommunicator] = {}
        self._finished = False
        self._scratch = np.empty(0, np.uint8)
        self._signatures: dict = {}  # call signature -> accounting.CallSignature
        self._workers = min(os.cpu_count() or 1, 8)
        self._pool: ThreadPoolExecutor | None = None
        self._everyone = tuple(range(transport.process_count))
        #: the algorithms' per-group plans (:func:`collectives.algorithms.sole_route`)
        self.routes: dict = {}
        # descriptors travel with the first data of a call (collectives.handshake)
        self._fuses = transport.process_count > 1 and transport.fuses_descriptors
        self._handshake: Handshake | None = None  # the leader's call in flight

    @property
    def process_index(self) -> int:
        return self.transport.process_index

    # -- entry points -------------------------------------------------------------------

    def replica_call(self, local_index: int, desc: Descriptor, value: Any,
                     algorithm: Algorithm, group: CommGroup | None = None) -> Any:
        """Called by local replica ``local_index``; returns its share of the result.

        ``desc.seq`` is filled in here. Raises the collective's error on every replica.
        """
        if self.num_local_replicas == 1:
            return self._sole_replica_call(desc, value, algorithm, group)
        with self._cond:
            seq = self._seq[local_index]
            slot = self._slots.get(seq)
            if slot is None or not slot.leading:
                # a replica arriving at a call that already failed shares its error
                self._raise_if_failed()
            self._seq[local_index] = seq + 1
            desc = desc.with_seq(seq)
            if slot is None:
                slot = self._slots[seq] = _Slot(self.num_local_replicas)
            slot.descs[local_index] = desc
            slot.values[local_index] = value
            slot.algorithm = slot.algorithm or algorithm
            slot.group = slot.group or group
            slot.arrived += 1
            leader = slot.arrived == self.num_local_replicas and not slot.leading
            slot.leading = slot.leading or leader
        if leader:
            self._lead(slot, 2 * seq)
        else:
            self._wait(slot, desc, local_index)
        with self._cond:
            slot.picked += 1
            if slot.picked == self.num_local_replicas:
                # (a slot abandoned for divergence stays: late replicas share its error)
                del self._slots[seq]
        if slot.error is not None:
            raise slot.error
        return slot.results[local_index]

    def _sole_replica_call(self, desc: Descriptor, value: Any, algorithm: Algorithm,
                           group: CommGroup | None) -> Any:
        """:meth:`replica_call` of an instance with one local replica: it leads at once
        (no rendezvous, nobody to wait for; the replica's thread alone counts its calls,
        so no lock)."""
        if self._failure is not None:
            self._raise_if_failed()
        seq = self._seq[0]
        self._seq[0] = seq + 1
        try:
            return self._execute((desc.with_seq(seq),), (value,), algorithm, group, 2 * seq)[0]
        except (CollectiveTimeoutError, TransportError) as exc:
            self.abort(exc)  # requests may still be pending: the engine is unusable
            raise

    def host_call(self, desc: Descriptor, values: Sequence[Any], algorithm: Algorithm) -> list:
        """A collective issued by the instance's host code (outside replica functions), with
        one value per local replica. Host calls have their own sequence numbers."""
        with self._cond:
            self._raise_if_failed()
            seq = self._host_seq
            self._host_seq += 1
        desc = replace(desc, seq=seq, op=f"host {desc.op}")
        return self._execute([desc] * self.num_local_replicas, list(values), algorithm, None,
                             2 * seq + 1)

    def run_started(self) -> None:
        """The local replicas are about to run a function (``strategy.run``); called before
        any of them starts."""
        with self._cond:
            self._finished_at = [None] * self.num_local_replicas

    def replica_finished(self, local_index: int) -> None:
        """Local replica ``local_index`` returned from its function: it calls no more
        collectives in this run, so replicas waiting for it are told (divergence)."""
        with self._cond:
            self._finished_at[local_index] = self._seq[local_index]
            self._cond.notify_all()

    def abort(self, cause: BaseException) -> None:
        """A local replica failed: wake every waiting replica with an error."""
        with self._cond:
            first = self._failure is None
            if first:
                self._failure = cause
            self._cond.notify_all()
        if first:  # the other instances raise instead of waiting for this one
            self.transport.abandon(f"{type(cause).__name__}: {cause}")

    def finish(self) -> None:
        """The program ends: tell the other instances, so one that still waits in a
        collective raises (naming this instance) instead of timing out. Idempotent.

        Raises:
            CollectiveMismatchError: another instance is still calling collectives.
        """
        with self._cond:
            if self._finished or self._failure is not None:
                return
            self._finished = True
            calls = self._seq[0] if self._seq else 0
        if self.transport.process_count == 1:
            return
        desc = Descriptor(seq=calls, op=END_OF_PROGRAM, operator="", dtype="", shape=(),
                          group="")
        try:
            self.exchange_descriptors(desc)
        except CollectiveTimeoutError as exc:
            logger.warning("at the end of the program: %s", exc)

    # -- for the algorithms ---------------------------------------------------------------

    def communicator(self, instances: tuple[int, ...]) -> CountingCommunicator:
        """The (counting) communicator of ``instances``; created once per instance set."""
        comm = self._comms.get(instances)
        if comm is None:
            comm = self._comms[instances] = CountingCommunicator(
                self.transport.communicator(instances))
        return comm

    def scratch(self, nbytes: int) -> np.ndarray:
        """A ``uint8[nbytes]`` buffer reused from call to call (the leader's alone: never
        hand it to a replica). Saves the page faults of a fresh large buffer per call."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes]

    def in_slices(self, size: int, itemsize: int, work: Callable[[int, int], None]) -> None:
        """Run ``work(lo, hi)`` over element slices covering ``[0, size)``: on the caller and
        the engine's helper threads when large, else once, at once. Slices are disjoint, so
        elementwise work gives the same bytes either way."""
        if size * itemsize < PARALLEL_MIN_BYTES or self._workers < 2:
            work(0, size)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers - 1,
                                            thread_name_prefix="collective-slices")
        step = max(1, _SLICE_BYTES // itemsize)
        starts = iter(range(0, size, step))  # shared: next() is atomic under the GIL

        def drain() -> None:
            for lo in starts:
                work(lo, min(lo + step, size))

        helpers = [self._pool.submit(drain) for _ in range(self._workers - 1)]
        drain()
        for helper in helpers:
            helper.result()

    def data_patience(self, desc: Descriptor, instances: Sequence[int]) -> Patience:
        """The wait of a data exchange between ``instances``; it carries the call's pending
        descriptor handshake, if any (see :mod:`collectives.handshake`), so the data waits
        only once every instance has arrived and agreed."""
        patience = Patience(_Text(desc.label), self.options, _Transfer(instances),
                            committed=True)
        patience.handshake = self._handshake
        return patience

    # -- internals ----------------------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise CollectiveAbortedError(
                f"collectives are unusable after {type(self._failure).__name__}: "
                f"{self._failure}") from self._failure

    def _lead(self, slot: _Slot, call_id: int) -> None:
        try:
            slot.results = self._execute(slot.descs, slot.values, slot.algorithm, slot.group,
                                         call_id)
        except BaseException as exc:  # every replica re-raises it
            slot.error = exc
            if isinstance(exc, (CollectiveTimeoutError, TransportError)):
                self.abort(exc)  # requests may still be pending: the engine is unusable
        with self._cond:
            slot.done = True
            self._cond.notify_all()

    def _wait(self, slot: _Slot, desc: Descriptor, local_index: int) -> None:
        def missing() -> str:
            absent = [self.replica_index_offset + i
                      for i, d in enumerate(slot.descs) if d is None]
            return f"replicas {absent}" if absent else "the other instances"

        patience = Patience(f"{desc.label()} on replica "
                            f"{self.replica_index_offset + local_index}",
                            self.options, missing)
        with self._cond:
            while not slot.done:
                if (self._failure is not None and slot.arrived < self.num_local_replicas
                        and not slot.leading):
                    slot.error = CollectiveAbortedError(
                        f"{desc.label()}: abandoned because a replica of this instance failed "
                        f"({type(self._failure).__name__}: {self._failure})")
                    slot.error.__cause__ = self._failure
                    return
                gone = [i for i, d in enumerate(slot.descs)
                        if d is None and self._finished_at[i] is not None]
                if gone and not slot.leading:
                    slot.leading = True
                    message = self._divergence_message(slot, desc, gone)
                    self._cond.release()
                    try:
                        self._lead_error(slot, desc, message)
                    finally:
                        self._cond.acquire()
                    continue
                self._cond.wait(patience.slice_s())
                if slot.arrived < self.num_local_replicas and not slot.leading:
                    patience.check()

    def _divergence_message(self, slot: _Slot, desc: Descriptor, gone: list[int]) -> str:
        off = self.replica_index_offset
        here = [off + i for i, d in enumerate(slot.descs) if d is not None]
        names = ", ".join(f"replica {off + i} (after {self._finished_at[i]} collectives)"
                          for i in gone)
        return (f"divergent control flow at {desc.signature()}: {names} returned from its "
                f"function without calling it, while replicas {here} called it")

    def _lead_error(self, slot: _Slot, desc: Descriptor, message: str) -> None:
        """Share ``message`` with the other instances (they raise it too), then raise it
        on the local replicas waiting in ``slot``."""
        error: BaseException = CollectiveMismatchError(message)
        try:
            self.exchange_descriptors(replace(desc, error=message))
        except BaseException as exc:  # the shared mismatch (or a timeout)
            error = exc
        slot.error = error
        self.abort(error)
        with self._cond:
            slot.done = True
            self._cond.notify_all()

    def _execute(self, descs: Sequence[Descriptor], values: Sequence[Any],
                 algorithm: Algorithm, group: CommGroup | None, call_id: int) -> list:
        start = time.perf_counter()
        desc = descs[0] if len(descs) == 1 else self._check_local(descs)
        value = values[0]  # (its size is the call's, on every replica)
        nbytes = value.nbytes if isinstance(value, np.ndarray) else int(np.asarray(value).nbytes)
        comms = self._comms.values()
        sent = 0
        for c in comms:
            sent -= c.bytes_sent
        if self._fuses and not desc.error:
            results = self._run_fused(desc, values, algorithm, call_id, nbytes)
        else:
            desc = self.exchange_descriptors(desc)
            results = algorithm(self, desc, values)
        wall = time.perf_counter() - start
        for c in comms:  # (a view: includes communicators the algorithm created)
            sent += c.bytes_sent
        self._record(desc, nbytes, group, sent, wall)
        return results

    def _run_fused(self, desc: Descriptor, values: Sequence[Any], algorithm: Algorithm,
                   call_id: int, nbytes: int) -> list:
        """Run ``algorithm`` with the descriptor handshake left to the transport, which
        carries it with the call's first data; completed here when nothing carried it."""
        handshake = self._handshake = Handshake(desc, self._everyone, call_id, self, nbytes)
        try:
            results = algorithm(self, desc, values)
        except BaseException as exc:
            if not handshake.done:  # failed before any exchange: the others must not wait
                handshake.done = True
                self._share_failure(desc, exc)
            raise
        finally:
            self._handshake = None
        handshake.complete()
        return results

    def _share_failure(self, desc: Descriptor, exc: BaseException) -> None:
        """Tell the other instances that this one failed in ``desc`` (they raise too)."""
        message = (f"{desc.label()} failed on {self._instance_name(self.process_index)}: "
                   f"{type(exc).__name__}: {exc}")
        try:
            self.exchange_descriptors(replace(desc, error=message))
        except CollectiveError:
            pass  # the shared error, or a timeout: this instance raises its own

    def _record(self, desc: Descriptor, nbytes: int, group: CommGroup | None,
                sent: int, wall: float) -> None:
        # the wire form of the signature (encoded once by ops, its hash kept) names the op,
        # dtype, shape and group; otherwise the fields themselves
        key = desc.__dict__.get("_body") or (desc.op, desc.operator, desc.dtype, desc.shape,
                                             desc.group, nbytes)
        signature = self._signatures.get(key)
        if signature is None:
            groups = (group or CommGroup()).members(self.num_replicas)
            method = self.gcl.modelled_method(len(groups[0]), nbytes)
            if len(self._signatures) >= 4096:
                self._signatures.clear()
            signature = self._signatures[key] = self.ledger.signature(
                desc.op, desc.operator, method, desc.dtype, desc.shape, nbytes, desc.group,
                groups, self.ipus_per_replica)
        self.ledger.add_signed(signature, sent, wall)

    def _check_local(self, descs: Sequence[Descriptor]) -> Descriptor:
        first = descs[0]
        for i, other in enumerate(descs[1:], start=1):
            diff = first.differences(other)
            if diff:
                a, b = self.replica_index_offset, self.replica_index_offset + i
                message = (f"replicas disagree on {first.label()}: replica {a} called "
                           f"{first.signature()}, replica {b} called {other.signature()} "
                           f"({'; '.join(diff)})")
                return replace(first, error=message)
        return first

    def _instance_name(self, i: int) -> str:
        L = self.num_local_replicas
        if L == 1:
            return f"instance {i} (replica {i})"
        return f"instance {i} (replicas {i * L}..{i * L + L - 1})"

    def exchange_descriptors(self, desc: Descriptor) -> Descriptor:
        """Exchange the descriptors; raise on every instance if any differs or failed."""
        if self.transport.process_count == 1:
            if desc.error:
                raise CollectiveMismatchError(desc.error)
            return desc
        comm = self.transport.communicator(self._everyone)
        patience = self.arrival_patience(desc)
        # the common case, every instance agrees: one small reduction of a fingerprint;
        # whole descriptors only to name a difference (every instance sees the same answer)
        if comm.agree(desc.fingerprint(), patience):
            if desc.error:  # every instance failed alike
                raise CollectiveMismatchError(desc.error)
            return desc
        mine = desc.encode()
        gathered = comm.allgather(mine, patience)
        self.check_descriptors(desc, mine, gathered)
        return desc

    def arrival_patience(self, desc: Descriptor) -> Patience:
        """The wait for the other instances' descriptors: names those not arrived."""
        return Patience(
            _Text(lambda: f"{desc.label()} on {self._instance_name(self.process_index)}"),
            self.options, _other_instances, name_absent=self._instance_names)

    def _instance_names(self, instances: Sequence[int]) -> str:
        return ", ".join(self._instance_name(i) for i in instances)

    def check_descriptors(self, desc: Descriptor, mine: np.ndarray,
                           gathered: np.ndarray) -> None:
        """Raise ``CollectiveMismatchError`` unless every row of ``gathered`` (one encoded
        descriptor per instance) is ``mine``, naming the first difference."""
        if not desc.error and gathered.tobytes() == mine.tobytes() * len(gathered):
            return  # the same bytes everywhere: nothing to decode
        descs = [Descriptor.decode(row) for row in gathered]
        errors = [d.error for d in descs if d.error]
        if errors:
            raise CollectiveMismatchError(errors[0])
        for i, other in enumerate(descs):
            diff = descs[0].differences(other)
            if diff:
                raise CollectiveMismatchError(self._mismatch_message(descs[0], other, i, diff))

    def _mismatch_message(self, first: Descriptor, other: Descriptor, i: int,
                          diff: list[str]) -> str:
        def what(d: Descriptor) -> str:
            if d.op == END_OF_PROGRAM:
                return f"ended its program after {d.seq} collectives"
            return f"called {d.signature()}"

        if END_OF_PROGRAM in (first.op, other.op):
            detail = "an instance stopped calling collectives (divergent control flow)"
        else:
            detail = "; ".join(diff)
        label = other.label() if first.op == END_OF_PROGRAM else first.label()
        return (f"replicas disagree on {label}: {self._instance_name(0)} {what(first)}, "
                f"{self._instance_name(i)} {what(other)} ({detail})")
