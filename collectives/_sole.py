"""The call path of an instance with one local replica (the common case under MPI).

Such an instance needs no local rendezvous: its replica leads every call at once, and its
calls are counted by its thread alone. The engine keeps a :class:`SolePlan` per call
signature (the descriptor ``ops`` reuses for it), made at the signature's first call, which
holds everything the signature fixes: whether it is eager (:mod:`collectives._eager`), the
descriptor's fingerprint at call number 0, the accounting signature, and the wait's
:class:`~collectives.waiting.Patience`, restarted at every call instead of made anew. A call
then does only what its number changes: the fingerprint, the data, the records.
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

    __slots__ = ("desc", "algorithm", "eager", "live", "_engine", "_fingerprint", "_signature",
                 "_arrival", "_patience", "_ledger", "_op")

    def __init__(self, engine, desc: Descriptor, algorithm, value: Any, group):
        value = np.asarray(value)
        self.desc = desc
        self.algorithm = algorithm
        self.eager = engine.is_eager(desc, algorithm, value)
        self.live = True  # (False: the engine made its plans anew, forget_plans)
        self._engine = engine
        self._fingerprint = desc.fingerprint()
        self._signature = engine.recorder.signature(desc, value.nbytes, group)
        self._arrival = Arrival(engine.agreement, desc, 0)
        self._patience = engine.agreement.arrival_patience(self._arrival)
        self._ledger = engine.ledger
        self._op = desc.op

    def __call__(self, value: Any) -> Any:
        """Call number ``seq`` of this signature (the next of the replica): its agreement,
        with its data when it is eager, else followed by its algorithm; recorded.

        Raises:
            The collective's errors; a timeout or transport failure also aborts the engine
            (requests may still be pending: it is unusable).
        """
        engine = self._engine
        rendezvous = engine.rendezvous
        if rendezvous.failure is not None:
            rendezvous.raise_if_failed()
        seq = rendezvous.seq[0]
        rendezvous.seq[0] = seq + 1
        start = time.perf_counter()
        try:
            self._arrival.seq = seq
            patience = self._patience
            patience.restart()
            algorithm = self.algorithm
            early = None
            if self.eager:
                payload = algorithm.sole_payload(engine, value)
                blocks = engine.agreement.agree_gather(
                    self.desc, seq, seq_fingerprint(self._fingerprint, seq), payload,
                    patience)
                if blocks is not None:
                    result = algorithm.sole_result(engine, value, blocks)
                    sent = payload.nbytes * (len(blocks) - 1)
                    engine.eager_calls += 1
                    self._record(sent, time.perf_counter() - start)
                    return result
            else:
                # a large call may post its data before its agreement (_algorithms.Early)
                early = getattr(algorithm, "sole_early", None)
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
            recorder = engine.recorder
            sent = recorder.bytes_sent()
            desc = self.desc.with_seq(seq)
            result = (early.finish(desc) if early is not None
                      else algorithm(engine, desc, (value,))[0])
            sent = recorder.bytes_sent() - sent
        except (CollectiveTimeoutError, TransportError) as exc:
            engine.abort(exc)
            raise
        self._record(sent, time.perf_counter() - start)
        return result

    def _record(self, sent: int, wall_s: float) -> None:
        """The call's entry in the ledger, and its modelled time on the replica's IPUs."""
        modelled = self._ledger.add_signed(self._signature, sent, wall_s)
        if modelled is not None:
            charge_collective(modelled, self._op)
