"""The call path of an instance with one local replica (the common case under MPI).

Such an instance needs no local rendezvous: its replica leads every call at once, and its
calls are counted by its thread alone. The engine keeps a :class:`SolePlan` per call
signature (the descriptor ``ops`` reuses for it), made at the signature's first call, which
holds everything the signature fixes: whether it is eager (:mod:`collectives._eager`), the
descriptor's fingerprint at call number 0, the accounting signature, the wait's
:class:`~collectives.waiting.Patience`, restarted at every call instead of made anew, and,
for a large all_gather, all_to_all or broadcast, its data movement
(:mod:`collectives._sole_move`). A call then does only what its number changes: the
fingerprint, the data, the records.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from ipu_node.clock import charge_collective

from collectives._agreement import Arrival
from collectives.descriptor import Descriptor, seq_fingerprint
from collectives.errors import CollectiveTimeoutError, TransportError

__all__ = ["SolePlan"]

_clock = time.perf_counter  # (a call's wall seconds)


class SolePlan:
    """Every call of one signature by a sole local replica (module docstring).

    Args:
        engine: the :class:`~collectives._engine.CollectiveEngine` (one local replica).
        desc: the signature's descriptor (``seq`` 0; the caller reuses it for every call).
        algorithm: the call's algorithm (an :class:`~collectives._eager.Eager` or any
            ``algorithm(engine, descriptor, values) -> results``).
        value: the first call's input (its size decides whether the signature is eager).
        group: the call's replica group (for the records).

    Attributes:
        live: whether the engine still runs this signature's calls with this plan.
    """

    __slots__ = ("desc", "algorithm", "eager", "live", "_engine", "_rendezvous",
                 "_fingerprint", "_signature", "_arrival", "_patience", "_ledger", "_op",
                 "_sole", "_agree", "_sent", "_move")

    def __init__(self, engine, desc: Descriptor, algorithm, value: Any, group):
        value = np.asarray(value)
        self.desc = desc
        self.algorithm = algorithm
        self.eager = engine.is_eager(desc, algorithm, value)
        self.live = True  # (False: the engine made its plans anew, forget_plans)
        self._engine = engine
        self._rendezvous = engine.rendezvous
        self._fingerprint = desc.fingerprint()
        self._signature = engine.recorder.signature(desc, value.nbytes, group)
        self._arrival = Arrival(engine.agreement, desc, 0)
        self._patience = engine.agreement.arrival_patience(self._arrival)
        self._ledger = engine.ledger
        self._op = desc.op
        if self.eager:
            # the transport's send buffer and agreement, the payload written straight there
            # (_sole_eager.SoleEager), with the views of both made once
            piece = algorithm.sole_piece(engine, value)
            index = None if piece is None else engine.agreement.eager_index_exchange(piece)
            if index is None:
                sizes = algorithm.sole_sizes(engine, value)
                send, self._agree = engine.agreement.eager_exchange(sizes)
                self._sent = send.nbytes * (len(sizes) - 1)
            else:  # (an all-to-all: each instance's piece towards it only)
                send, self._agree, self._sent = index
            self._sole = algorithm.sole(engine, value, send, index is not None)
            self._move = None
        else:
            # the data moved after the agreement, prepared once (_sole_move.SoleMove)
            move = getattr(algorithm, "sole_move", None)
            self._move = move(engine, desc, value) if move is not None else None

    def __call__(self, value: Any) -> Any:
        """Call number ``seq`` of this signature (the next of the replica): its agreement,
        with its data when it is eager, else followed by its algorithm; recorded.

        Raises:
            The collective's errors; a timeout or transport failure also aborts the engine
            (requests may still be pending: it is unusable).
        """
        rendezvous = self._rendezvous
        if rendezvous.failure is not None:
            rendezvous.raise_if_failed()
        seq = rendezvous.seq[0]
        rendezvous.seq[0] = seq + 1
        start = _clock()
        engine = self._engine
        try:
            self._arrival.seq = seq
            patience = self._patience
            patience.restart()
            early = None
            if self.eager:
                sole = self._sole
                sole.fill(value)
                agreed, blocks = self._agree(seq_fingerprint(self._fingerprint, seq),
                                             patience)
                if not agreed:
                    engine.agreement.disagree(self.desc.with_seq(seq), patience)
                elif blocks is not None:
                    result = sole.result(value, blocks)
                    engine.eager_calls += 1
                    modelled = self._ledger.add_signed(self._signature, self._sent,
                                                       _clock() - start)
                    if modelled is not None:
                        charge_collective(modelled, self._op)
                    return result
            else:
                # a large call may post its data before its agreement (_algorithms.Early)
                early = getattr(self.algorithm, "sole_early", None)
                early = early(engine, value, seq) if early is not None else None
                try:
                    engine.agreement.agree_gather(self.desc, seq,
                                                  seq_fingerprint(self._fingerprint, seq),
                                                  None, patience)
                except BaseException:
                    if early is not None:
                        early.withdraw()
                    raise
            # (large, or a transport that does not carry payloads)
            if early is None and self._move is not None:
                result, sent = self._move(value, seq)
            else:
                recorder = engine.recorder
                sent = recorder.bytes_sent()
                desc = self.desc.with_seq(seq)
                result = (early.finish(desc) if early is not None
                          else self.algorithm(engine, desc, (value,))[0])
                sent = recorder.bytes_sent() - sent
        except (CollectiveTimeoutError, TransportError) as exc:
            engine.abort(exc)
            raise
        self._record(sent, _clock() - start)
        return result

    def _record(self, sent: int, wall_s: float) -> None:
        """The call's entry in the ledger, and its modelled time on the replica's IPUs (the
        eager path does the same in line: a call less)."""
        modelled = self._ledger.add_signed(self._signature, sent, wall_s)
        if modelled is not None:
            charge_collective(modelled, self._op)
