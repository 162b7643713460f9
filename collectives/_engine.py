"""The collective engine of one instance: local rendezvous, agreement, then the algorithm.

Every local replica deposits its contribution for call number ``seq``
(:mod:`collectives._rendezvous`); the last to arrive (the leader) checks that all
descriptors agree, agrees with the other instances (:mod:`collectives._agreement`: every
instance raises on a mismatch instead of waiting, and a stall names the instances that have
not arrived), runs the algorithm (local combine in shared memory, exchange over the
transport), records the call (:mod:`collectives._recording`) and hands each replica its
result. Only the leader touches the transport, one call at a time.

A small call whose group is every replica moves its data *in* its agreement
(:mod:`collectives._eager`): one exchange instead of an agreement round and the
algorithm's rounds, with bit-identical results. An instance with one local replica (the
common case under MPI) skips the rendezvous and keeps a plan per call signature
(:class:`collectives._sole.SolePlan`), so a call does only what its number changes: the
agreement's fingerprint, the data, the records.

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
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from collectives._agreement import END_OF_PROGRAM, Agreement, Text
from collectives._eager import Eager
from collectives._fusion import FusionLimits
from collectives._recording import CallRecorder
from collectives._rendezvous import Rendezvous, Slot
from collectives._sole import SolePlan
from collectives._accounting import CountingCommunicator, Ledger
from collectives.descriptor import Descriptor
from collectives.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                TransportError)
from collectives.gcl_options import GCLOptions
from collectives.groups import CommGroup
from collectives.options import CollectiveOptions
from collectives.transports.base import Transport
from collectives.waiting import Patience

logger = logging.getLogger("collectives")

#: ``algorithm(engine, descriptor, values) -> results``: values and results per local replica.
Algorithm = Callable[["CollectiveEngine", Descriptor, Sequence[Any]], list]

#: local reductions and result copies of at least this many bytes run in slices on several
#: threads (numpy releases the GIL); slices small enough to stay in the CPU cache
PARALLEL_MIN_BYTES = 1 << 20
_SLICE_BYTES = 128 << 10


class _Transfer:
    """Who a data wait waits for, for messages."""

    __slots__ = ("instances",)

    def __init__(self, instances: Sequence[int]):
        self.instances = instances

    def __call__(self) -> str:
        return f"instances {list(self.instances)} to finish the transfer"


#: call plans an engine keeps before it starts again (a program calls few signatures; also
#: the cap of collectives._dispatch's descriptors and common-call plans)
MAX_PLANS = 4096


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
        fusion: the most bytes of a fused buffer of a nest (``IPUConfig.optimizations``).

    Attributes:
        ledger: the records of this engine's calls.
        agreement: the descriptor agreement between instances.
        rendezvous: the local replicas' rendezvous (call numbers; the failure that made the
            engine unusable).
        recorder: puts every call in the ledger.
        routes: the algorithms' per-group plans (:func:`collectives._routing.sole_route`).
        eager_calls: calls whose data moved in their agreement (:mod:`collectives._eager`).
    """

    def __init__(self, num_replicas: int, num_local_replicas: int, replica_index_offset: int,
                 transport: Transport, options: CollectiveOptions,
                 gcl: GCLOptions | None = None, ipus_per_replica: int = 1,
                 fusion: FusionLimits | None = None):
        self.num_replicas = num_replicas
        self.num_local_replicas = num_local_replicas
        self.replica_index_offset = replica_index_offset
        self.transport = transport
        self.options = options
        self.gcl = gcl or GCLOptions()
        self.ipus_per_replica = ipus_per_replica
        self.fusion = fusion or FusionLimits()
        self.ledger = Ledger()
        self.agreement = Agreement(transport, options, num_local_replicas,
                                   replica_index_offset)
        self.rendezvous = Rendezvous(num_local_replicas, replica_index_offset, options)
        self._comms: dict[tuple[int, ...], CountingCommunicator] = {}
        self.recorder = CallRecorder(self.ledger, self.gcl, num_replicas, ipus_per_replica,
                                      self._comms)
        self._finished = False
        self._scratch = np.empty(0, np.uint8)
        self._workers = min(os.cpu_count() or 1, 8)
        self._pool: ThreadPoolExecutor | None = None
        self._plans: dict[int, SolePlan] = {}
        self.eager_calls = 0
        self.routes: dict = {}

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
            return self.sole_plan(desc, algorithm, value, group)(value)
        rendezvous = self.rendezvous
        slot, seq, leader = rendezvous.arrive(local_index, desc, value, algorithm, group)
        if leader:
            self._lead(slot)
        else:
            rendezvous.wait(slot, slot.descs[local_index], local_index, self._lead_error)
        rendezvous.leave(slot, seq)
        if slot.error is not None:
            raise slot.error
        return slot.results[local_index]

    def sole_plan(self, desc: Descriptor, algorithm: Algorithm, value: Any,
                  group: CommGroup | None) -> SolePlan:
        """The :class:`~collectives._sole.SolePlan` that runs the calls of ``desc`` (a
        descriptor the caller reuses for every call of its signature, ``seq`` 0) with
        ``algorithm`` on an instance with one local replica; made at the first call."""
        plan = self._plans.get(id(desc))
        if plan is None or plan.desc is not desc or plan.algorithm is not algorithm:
            plan = SolePlan(self, desc, algorithm, value, group)
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[id(desc)] = plan
        return plan

    def forget_plans(self) -> None:
        """Make every call's plan anew at its next call (e.g. after a change of
        ``EAGER_MAX_BYTES``); the plans kept elsewhere stop being used (``live``)."""
        for plan in self._plans.values():
            plan.live = False
        self._plans.clear()

    def is_eager(self, desc: Descriptor, algorithm: Algorithm, value: np.ndarray) -> bool:
        """Whether the call moves its data in its agreement (:mod:`collectives._eager`):
        an eager algorithm, no error to share, a small payload (``value``: one local
        replica's input)."""
        return (isinstance(algorithm, Eager) and not desc.error
                and algorithm.payload_bytes(self, value) is not None)

    def host_call(self, desc: Descriptor, values: Sequence[Any], algorithm: Algorithm) -> list:
        """A collective issued by the instance's host code (outside replica functions), with
        one value per local replica. Host calls have their own sequence numbers."""
        seq = self.rendezvous.next_host_seq()
        desc = replace(desc, seq=seq, op=f"host {desc.op}")
        return self._execute([desc] * self.num_local_replicas, list(values), algorithm, None)

    def run_started(self) -> None:
        """The local replicas are about to run a function (``strategy.run``); called before
        any of them starts."""
        self.rendezvous.run_started()

    def replica_finished(self, local_index: int) -> None:
        """Local replica ``local_index`` returned from its function: it calls no more
        collectives in this run, so replicas waiting for it are told (divergence)."""
        self.rendezvous.replica_finished(local_index)

    def abort(self, cause: BaseException) -> None:
        """A local replica failed, or a wait timed out: wake every waiting replica with an
        error, and tell the other instances (``Transport.abandon``: they raise instead of
        waiting for this one)."""
        first = self.rendezvous.failure is None
        self.rendezvous.abort(cause)
        if first:
            self.transport.abandon(f"{type(cause).__name__}: {cause}")

    def finish(self) -> None:
        """The program ends: tell the other instances, so one that still waits in a
        collective raises (naming this instance) instead of timing out. Idempotent.

        Raises:
            CollectiveMismatchError: another instance is still calling collectives.
        """
        rendezvous = self.rendezvous
        with rendezvous.cond:
            if self._finished or rendezvous.failure is not None:
                return
            self._finished = True
            calls = rendezvous.seq[0]
        if self.transport.process_count == 1:
            return
        desc = Descriptor(seq=calls, op=END_OF_PROGRAM, operator="", dtype="", shape=(),
                          group="")
        try:
            self.agreement.exchange_descriptors(desc)
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

    def data_patience(self, desc: Descriptor, instances: Sequence[int],
                      what: object | None = None) -> Patience:
        """The wait of a data exchange between ``instances`` (after the call's agreement:
        every instance has arrived); ``what``: its text in messages (str() when shown),
        else ``desc``'s label."""
        return Patience(Text(desc.label) if what is None else what, self.options,
                        _Transfer(instances), committed=True)

    # -- call execution -----------------------------------------------------------------

    def _lead(self, slot: Slot) -> None:
        try:
            slot.results = self._execute(slot.descs, slot.values, slot.algorithm, slot.group)
        except BaseException as exc:  # every replica re-raises it
            slot.error = exc
            if isinstance(exc, (CollectiveTimeoutError, TransportError)):
                self.abort(exc)  # requests may still be pending: the engine is unusable
        self.rendezvous.done(slot)

    def _lead_error(self, slot: Slot, desc: Descriptor, message: str) -> None:
        """Share ``message`` with the other instances (they raise it too), then raise it
        on the local replicas waiting in ``slot``."""
        error: BaseException = CollectiveMismatchError(message)
        try:
            self.agreement.exchange_descriptors(replace(desc, error=message))
        except BaseException as exc:  # the shared mismatch (or a timeout)
            error = exc
        slot.error = error
        self.abort(error)
        self.rendezvous.done(slot)

    def _execute(self, descs: Sequence[Descriptor], values: Sequence[Any],
                 algorithm: Algorithm, group: CommGroup | None) -> list:
        start = time.perf_counter()
        desc = descs[0] if len(descs) == 1 else self.agreement.check_local(descs)
        value = values[0]  # (its size is the call's, on every replica)
        nbytes = value.nbytes if isinstance(value, np.ndarray) else int(np.asarray(value).nbytes)
        recorder = self.recorder
        payload = algorithm.payload(self, values) if self.is_eager(desc, algorithm, value) \
            else None
        sent = -recorder.bytes_sent()
        blocks = self.agreement.exchange(desc, payload)
        if blocks is not None:
            results = algorithm.results(self, values, blocks)
            sent += payload.nbytes * (len(blocks) - 1)
            self.eager_calls += 1
        else:
            results = algorithm(self, desc, values)
        wall = time.perf_counter() - start
        sent += recorder.bytes_sent()
        recorder.record(desc, nbytes, group, sent, wall)
        return results
