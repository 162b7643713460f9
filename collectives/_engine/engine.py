"""The collective engine of one instance: the plans of its call signatures, the local
rendezvous of its replicas, and its transport.

Every call runs its signature's :class:`~collectives._engine.plan.Plan` (made at the signature's
first call, :meth:`CollectiveEngine.plan`): combine, agree, exchange, finish, recorded. An
instance with one local replica (the common case under MPI) runs it at once; with several,
every local replica deposits its value for call number ``seq``
(:mod:`collectives._engine.rendezvous`), and the last to arrive (the leader) checks that all
descriptors agree (:meth:`~collectives._engine.agreement.Agreement.check_local`) and runs the plan
with every replica's value, then hands each replica its result. Only the leader touches the
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Sequence


from collectives._engine.agreement import END_OF_PROGRAM, Agreement
from collectives._engine.exchange import Scratch
from collectives._engine.fusion import FusionLimits
from collectives._engine.plan import Plan
from collectives._engine.recording import CallRecorder
from collectives._engine.rendezvous import Rendezvous, Slot
from collectives._engine.ledger import Ledger
from collectives._engine.descriptor import Descriptor
from collectives.errors import CollectiveMismatchError, CollectiveTimeoutError, PeerLostError
from collectives.gcl_options import GCLOptions
from collectives.options import CollectiveOptions
from collectives.transports.base import Communicator, Transport
from collectives.waiting import Patience

logger = logging.getLogger("collectives")

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
#: the cap of collectives._engine.plan's common-call plans)
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
        scratch: where the reductions' exchanges receive (one buffer, reused: the
            leader's alone).
        carried_calls: calls whose data moved in their agreement
            (:attr:`collectives._engine.plan.Plan.carry`).
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
        self.recorder = CallRecorder(self.ledger, self.gcl, num_replicas, ipus_per_replica)
        self._finished = False
        self.scratch = Scratch()
        self._workers = min(os.cpu_count() or 1, 8)
        self._pool: ThreadPoolExecutor | None = None
        self._plans: dict[tuple, Plan] = {}
        self._plan_lock = threading.Lock()
        self.carried_calls = 0

    @property
    def process_index(self) -> int:
        return self.transport.process_index

    # -- entry points -------------------------------------------------------------------

    def plan(self, key: tuple, make: Callable[[], Plan]) -> Plan:
        """The plan of call signature ``key`` (hashable: the op, its arguments, the
        input's dtype and shape), ``make()`` at its first call (by one local replica at a
        time: a plan makes the transport's communicators, which every instance must make
        once, in the same order)."""
        plan = self._plans.get(key)
        if plan is None:
            with self._plan_lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = make()
                    if len(self._plans) >= MAX_PLANS:
                        self.forget_plans()
                    self._plans[key] = plan
        return plan

    def forget_plans(self) -> None:
        """Make every call's plan anew at its next call (e.g. after a change of
        ``CARRIED_MAX_BYTES``); the plans kept elsewhere stop being used (``live``)."""
        for plan in self._plans.values():
            plan.live = False
        self._plans.clear()

    def replica_call(self, local_index: int, plan: Plan, value: Any) -> Any:
        """Called by local replica ``local_index`` with its input; returns its share of the
        result. Raises the collective's error on every replica."""
        if self.num_local_replicas == 1:
            return plan.run((value,))[0]
        rendezvous = self.rendezvous
        slot, seq, leader = rendezvous.arrive(local_index, plan.desc, value, plan)
        if leader:
            self._lead(slot, seq)
        else:
            rendezvous.wait(slot, slot.descs[local_index], local_index, self._lead_error)
        rendezvous.leave(slot, seq)
        if slot.error is not None:
            raise slot.error
        return slot.results[local_index]

    def host_call(self, plan: Plan, values: Sequence[Any]) -> list:
        """A collective issued by the instance's host code (outside replica functions), with
        one value per local replica. Host calls have their own sequence numbers."""
        return plan.run(list(values), self.rendezvous.next_host_seq())

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
        collective raises (naming this instance) instead of timing out. Idempotent. An
        instance already seen to have ended its program (a call of this one disagreed with
        its end of program) is not waited for: it takes part in no agreement again.

        Raises:
            CollectiveMismatchError: another instance is still calling collectives.
            PeerLostError: another instance ended its program while this one still called
                collectives (this instance's program caught that call's error).
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
        agreement = self.agreement
        if agreement.ended:
            instance, ended_after = min(agreement.ended.items())
            counts = (f" after {ended_after} collectives, while this instance called {calls}"
                      if ended_after != calls else " while this instance still called "
                      "collectives")
            raise PeerLostError(
                f"{desc.label()} on {agreement.instance_name(self.process_index)}: "
                f"{agreement.instance_name(instance)} ended its program{counts}: the job "
                f"failed (every instance must call the same collectives)", instance)
        try:
            self.agreement.exchange_descriptors(desc)
        except CollectiveTimeoutError as exc:
            logger.warning("at the end of the program: %s", exc)

    # -- for the algorithms ---------------------------------------------------------------

    def communicator(self, instances: tuple[int, ...]) -> Communicator:
        """The transport's communicator of ``instances`` (made once by the transport)."""
        return self.transport.communicator(instances)

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

    def data_patience(self, what: object, instances: Sequence[int]) -> Patience:
        """The wait of a data exchange between ``instances`` (after the call's agreement:
        every instance has arrived); ``what``: the call, in messages (str() when shown: a
        plan's :class:`~collectives._engine.plan.CallText`, restarted with the wait at every
        call)."""
        return Patience(what, self.options, _Transfer(instances), committed=True)

    # -- call execution -----------------------------------------------------------------

    def _lead(self, slot: Slot, seq: int) -> None:
        try:
            descs = slot.descs
            desc = self.agreement.check_local(descs)
            slot.results = slot.plan.run(slot.values, seq, desc if desc.error else None)
        except BaseException as exc:  # every replica re-raises it
            slot.error = exc
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
