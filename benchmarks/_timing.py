"""How ``benchmarks/collectives.py`` (and ``benchmarks/thresholds.py``) time their contenders:
in rounds, each contender once a round in a shuffled order after an untimed barrier, the
medians over rounds compared; how many rounds and how many calls a round makes."""

from __future__ import annotations

import random
import statistics
import time

import numpy as np

__all__ = ["calls_per_run", "interleaved_medians", "median_time", "rounds"]


def rounds(size: int, calls: int, quick: bool) -> int:
    """Rounds of :func:`interleaved_medians` for an op of ``size`` bytes timed ``calls``
    at a time: enough for about 1 GiB of payload per contender (64 MiB with ``quick``),
    between 30 and 300 (10 and 60 with ``quick``). The floor keeps the median steady: with
    the 200 calls of the earlier budget, 4 KiB ran 10 rounds of 20 calls and 1 MiB 50
    rounds of 4, and on the 2-core VM a 1 MiB all_gather's ratio then swung 0.42-0.72
    over three runs of the same checkout, against 0.74-0.79 over 300 rounds."""
    budget, lo, hi = ((64 << 20), 10, 60) if quick else ((1 << 30), 30, 300)
    return int(max(lo, min(hi, budget // (size * calls))))


def calls_per_run(size: int) -> int:
    """Calls of an op timed together inside one ``strategy.run`` (a replica function calls
    many collectives; the run's own fixed cost is reported apart): enough for about 4 MiB
    of payload, at most 20."""
    return int(max(1, min(20, (4 << 20) // size)))


def median_time(fn, reps: int) -> float:
    return interleaved_medians([fn], reps)[0]


def interleaved_medians(fns, reps: int, sync=None, combine=None) -> list[float]:
    """Median wall seconds of each of ``fns`` over ``reps`` rounds, the contenders timed in
    turn within every round: a change in the machine's state (this 2-core VM's memory
    bandwidth and scheduling swing by 2-4x from minute to minute) hits them alike.

    ``sync()`` (untimed; the instances' barrier) runs before each contender, so that none
    is charged for the previous one's end on the other instances: a collective returns on
    each instance at a different time (a broadcast's root before or after the others, the
    last sender of a reduction last), and without it the next contender's first call on
    instance 0 (the one that reports) waits for the others to finish the previous one.
    The contenders run in a new order every round (the same on every instance: a seeded
    shuffle), so that none always follows the same one (what a call leaves behind, in the
    caches and in MPI's progress state, costs the next call too).

    ``combine(times)`` (untimed): ``times`` (float64 ``[len(fns), reps]``, this instance's
    seconds) -> the mean over the instances of each round, so that every instance's time
    counts (a broadcast's root returns as soon as its bytes are taken, before the others
    have them; only instance 0 reports). The mean rather than the most any instance took:
    a maximum over instances catches either one's scheduling delays on this loaded
    2-core VM (4 KiB rounds varied tenfold from run to run)."""
    times: list[list[float]] = [[] for _ in fns]
    order = random.Random(0)
    for _ in range(reps):
        pairs = list(zip(fns, times))
        order.shuffle(pairs)
        for fn, acc in pairs:
            if sync is not None:
                sync()
            start = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - start)
    if combine is not None:
        times = combine(np.asarray(times, np.float64)).tolist()
    return [statistics.median(t) for t in times]
