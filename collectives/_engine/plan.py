"""One plan per call signature: every collective call, of any op, layout and size, runs the
same four steps of its signature's :class:`Plan`.

1. **combine** the local replicas' part of the canonical tree (a reduction's partials; the
   values themselves for the data movement);
2. **agree** with the other instances on the call's fingerprint
   (:mod:`collectives._engine.agreement`), the call's data carried in the agreement when it is
   small (:attr:`Plan.carry`);
3. **exchange** the data between the instances (skipped when carried; posted before the
   agreement for a large call where the transport can, :attr:`Plan.posts`);
4. **finish**: the rest of the tree, and each local replica's result array.

What an op does in each step is its steps object (:class:`collectives._engine.reduction.Reduction`,
:class:`collectives._engine.movement.Gather`, ``AllToAll``, ``Broadcast``), made once per signature
with everything the signature fixes (groups, communicators, byte counts, layouts). The two
choices are fields of the plan, made once from measured thresholds and the communicator's
:class:`~collectives.transports.base.Capabilities`; every instance whose call agrees makes
them alike (they read the call's descriptor and the job's layout only):

* :attr:`Plan.carry`: a call whose group is every replica, over more than one instance,
  with at most ``CARRIED_MAX_BYTES`` of payload per instance, and an operator other than
  LOCAL, carries its payload in its agreement: one exchange in all instead of two or three.
  Where each instance needs only its piece of every payload (a reduce-scatter; an all-to-all
  along dimension 0 with one replica per instance) and the transport takes such pieces
  (:func:`~collectives.transports.base.takes_index`), it carries only those.
* :attr:`Plan.posts`: a call of :data:`POSTED_MIN_BYTES` of result or more whose data is
  one exchange on a communicator that posts (MPI, three instances or more) starts that
  exchange before its agreement, withdrawn when the call does not agree.

A call is recorded once, with the bytes its plan sends (worked out once, from the counts of
its operations) and its wall time, in the engine's ledger; its modelled time goes to the
replicas' modelled clocks.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np
from ipu_node import current_replica_context
from ipu_node.clock import charge_collective

from collectives._engine.agreement import Arrival
from collectives._engine.descriptor import FINGERPRINT_MASK, SEQ_MIX, Descriptor
from collectives.errors import CollectiveTimeoutError, TransportError
from collectives.groups import CommGroup
from collectives.transports.base import CARRIED_MAX_BYTES, Carry, takes_index

__all__ = ["CARRIED_MAX_BYTES", "POSTED_MIN_BYTES", "CallText", "Plan", "common", "common_plans",
           "seq_fingerprint"]

#: bytes of a call's result from which its one exchange is posted before its agreement,
#: where the communicator posts; below, the exchange after the agreement costs less Python
#: than posting saves (``benchmarks/thresholds.py -n 4 --only posted`` times both sides).
POSTED_MIN_BYTES = 4 << 20

_clock = time.perf_counter  # (a call's wall seconds)


def seq_fingerprint(fingerprint: int, seq: int) -> int:
    """The :meth:`~collectives._engine.descriptor.Descriptor.fingerprint` of a descriptor
    with sequence number ``seq``, from the fingerprint of the same descriptor with sequence
    number 0 (no descriptor made): what a plan's call number ``seq`` agrees on."""
    return (fingerprint + seq * SEQ_MIX) & FINGERPRINT_MASK


class CallText:
    """The text of a call's waits, ``"all_gather #7"``, made when first shown (most waits
    end without one); ``seq``: the call's number (set at every call)."""

    __slots__ = ("_desc", "seq")

    def __init__(self, desc: Descriptor):
        self._desc, self.seq = desc, desc.seq

    def __str__(self) -> str:
        desc = self._desc
        return (desc if desc.seq == self.seq else desc.with_seq(self.seq)).label()

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class Plan:
    """Every call of one signature on one engine (module docstring).

    Args:
        engine: the :class:`~collectives._engine.engine.CollectiveEngine`.
        desc: the signature's descriptor (``seq`` 0).
        make_steps: ``make_steps(engine, text) -> steps``: the op's steps for this
            signature (``text``: the call's :class:`CallText`, for its waits).
        nbytes: input bytes of one replica (for the records).
        group: the call's replica group (for the records).
        host: a call of the instance's host code (its own call numbers; no replica's
            modelled clock waits in it).

    Attributes:
        carry: the payload the call's agreement carries, or None (its data is exchanged).
        posts: the call's exchange is posted before its agreement.
        live: whether the engine still runs this signature's calls with this plan.
    """

    __slots__ = ("desc", "steps", "carry", "posts", "live", "_engine", "_text", "_host",
                 "_agreement", "_comm", "_fingerprint", "_arrival", "_patience", "_send",
                 "_sent", "_signature", "_ledger", "_op")

    def __init__(self, engine, desc: Descriptor, make_steps: Callable[[Any, CallText], Any],
                 nbytes: int, group: CommGroup | None, host: bool = False):
        self.desc = desc
        self._text = CallText(desc)
        self.steps = steps = make_steps(engine, self._text)
        self.live = True  # (False: the engine made its plans anew, forget_plans)
        self._engine, self._host, self._op = engine, host, desc.op
        self._agreement = agreement = engine.agreement
        count = engine.transport.process_count
        self._comm = agreement.communicator() if count > 1 else None
        self._fingerprint = desc.fingerprint()
        self._arrival = Arrival(agreement, desc, 0)
        self._patience = agreement.arrival_patience(self._arrival)
        self.carry = self._carried(steps) if count > 1 else None
        self.posts = self.carry is None and count > 1 and steps.posts() \
            and steps.result_bytes() >= POSTED_MIN_BYTES
        self._send = None
        if self.carry is not None:
            self._send = self._comm.send_buffer(self.carry)
            steps.carry_into(self.carry, self._send)
        self._sent = steps.sent if self.carry is None else \
            self.carry.sent_bytes(self._comm.rank)
        self._signature = engine.recorder.signature(desc, nbytes, group)
        self._ledger = engine.ledger

    def _carried(self, steps) -> Carry | None:
        """The payload the agreement carries (module docstring), or None."""
        carry = steps.carry(self._engine)
        capabilities = self._comm.capabilities
        if carry is None or not capabilities.carries or max(carry.sizes) > CARRIED_MAX_BYTES:
            return None
        piece, count = steps.piece(self._engine), len(carry.sizes)
        if piece and takes_index(count, piece, capabilities.index_limit_bytes):
            return Carry.indexed(count, piece)
        return carry

    def run(self, values: Sequence[Any], seq: int | None = None,
            desc: Descriptor | None = None) -> list:
        """Call number ``seq`` with one value per local replica: its four steps (module
        docstring), recorded; one result per local replica. ``seq`` None: the next call of
        the instance's one local replica (no rendezvous: it leads every call). ``desc``: the
        call's descriptor when it carries an error (a local replica called something
        else): every instance raises it.

        Raises:
            The collective's errors (CollectiveAbortedError once the engine is unusable); a
            timeout or transport failure also aborts the engine (requests may still be
            pending: it is unusable).
        """
        if seq is None:
            rendezvous = self._engine.rendezvous
            if rendezvous.failure is not None:
                rendezvous.raise_if_failed()
            seq = rendezvous.seq[0]
            rendezvous.seq[0] = seq + 1
        start = _clock()
        steps, comm = self.steps, self._comm
        self._text.seq = seq
        try:
            if desc is not None and desc.error:
                self._agreement.exchange_descriptors(desc)
            partials = steps.combine(values) if steps.combines else values  # 1. combine
            if comm is None:
                results = steps.finish(values, partials, None, None)
            else:
                started = steps.start(partials, seq) if self.posts else None  # (3., posted)
                try:                                                # 2. agree
                    self._arrival.seq = seq
                    patience = self._patience
                    patience.restart()
                    if self.carry is not None:
                        steps.fill(partials, self._send)
                    agreed, blocks = comm.agree(seq_fingerprint(self._fingerprint, seq),
                                                patience, self.carry).wait()
                    if not agreed:
                        self._agreement.disagree(self.desc.with_seq(seq), patience)
                except BaseException:
                    if started is not None:
                        steps.withdraw(started)
                    raise
                if blocks is not None:
                    self._engine.carried_calls += 1
                results = steps.finish(values, partials, blocks, started)  # 3., 4.
        except (CollectiveTimeoutError, TransportError) as exc:
            self._engine.abort(exc)
            raise
        modelled = self._ledger.add_signed(self._signature, self._sent, _clock() - start)
        if modelled is not None and not self._host:
            charge_collective(modelled, self._op)
        return results


# -- the common call: a one-replica instance's call found without its arguments' checks ------

#: the plans of one-replica instances' calls without a group or name argument (the common
#: call), by ``((op, its scalar arguments), the input's dtype, its shape)``: ``(replica
#: context, plan)``. A call found here skips the argument checks (its dtype and shape passed
#: them at its first call), the plan's look-up by signature and the engine's dispatch; its
#: replica context tells that it runs in the same system.
common_plans: dict[tuple, tuple] = {}


def common(x, size, group, name, key: tuple | None) -> tuple:
    """``(plan, common_key)`` of a call with input ``x``, a size argument ``size``,
    ``group`` and ``name`` (``key``: the op and its scalar arguments; None when they are not
    plain): the plan a one-replica instance made at an earlier such call, or None; and the
    key under which :func:`collectives._engine.dispatch.call` keeps the plan (None: not a
    common call: ``x`` is not an ndarray, or a size, group or name is given)."""
    if key is None or type(x) is not np.ndarray or size is not None or group is not None \
            or name is not None:
        return None, None
    found = common_plans.get((key, x.dtype, x.shape))
    if found is not None and found[0] is current_replica_context() and found[1].live:
        return found[1], key
    return None, key
