"""The least a small agreed call can cost in Python over MPI, against the raw calls, in one run.

Run under poprun (or mpirun), two instances::

    poprun -n 2 python benchmarks/agreement_floor.py [--bytes 4096]

Issue 10 asks a 4 KiB collective to cost at most 3x the raw mpi4py call. Every ipupod call
must agree (every instance learns that every other one made the same call, and a
disagreement raises everywhere instead of hanging), so even a broadcast, which raw MPI does
as one message from the root, needs one exchange between the instances. This benchmark
times, in turn within every round after a barrier, ``--calls`` calls of:

* ``bcast fresh`` / ``bcast in-place``: ``Comm.Bcast`` into a new array / into one buffer;
* ``agreed bcast``: the fewest Python lines of an agreed broadcast: a fingerprint and the
  root's payload written into one persistent send buffer, one persistent exchange polled
  with ``Test``, the fingerprint compared, the result copied out (no sequence numbers, no
  replica context, no records, no modelled time, no notices of peers that gave up, no
  timeout: what ipupod's call adds to this is its own cost);
* ``allreduce fresh`` / ``allreduce in-place`` and ``agreed sum``: the same for a sum.

* ``fingerprint Allgather`` / ``fingerprint Allreduce MIN`` / ``Barrier``: MPI's own
  synchronising calls on a 16-byte fingerprint block (what any agreement must at least do:
  every instance learns that every other one arrived with the same call), at any number of
  instances.

It prints the medians over rounds (microseconds per call; instance 0) and the floor's
ratios to raw. With more than two instances (``poprun -n 4``) only the raw calls and MPI's
synchronising ones run: they show what a 4 KiB broadcast that must agree can cost at best
where the instances outnumber the cores.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

_HEADER = 16  # bytes: the fingerprint (int64) and a spare word, as ipupod's blocks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4096, help="payload bytes (float32)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.size < 2:
        parser.error("run it on two or more instances (poprun -n 2 python benchmarks/...)")
    rank, pair = comm.rank, comm.size == 2
    other = 1 - rank if pair else None
    x = np.ones(args.bytes // 4, np.float32)
    out = np.empty_like(x)
    send = np.zeros(_HEADER + x.nbytes, np.uint8)
    recv = np.zeros_like(send)
    sent_word, got_word = send[:8].view(np.int64), recv[:8].view(np.int64)
    sent_payload, got_payload = send[_HEADER:].view(np.float32), recv[_HEADER:].view(np.float32)
    if pair:
        receive = comm.Recv_init([recv, MPI.BYTE], other, 9)
        post = comm.Send_init([send, MPI.BYTE], other, 9)
    seq = [0]
    block = np.zeros(2, np.int64)  # (a fingerprint and a spare word)
    blocks = np.zeros(2 * comm.size, np.int64)
    least = np.zeros(2, np.int64)

    def exchange() -> None:
        seq[0] += 1
        fingerprint = 0x5EED ^ seq[0]
        sent_word[0] = fingerprint
        receive.Start()
        post.Start()
        while not receive.Test():
            pass
        while not post.Test():
            pass
        if got_word[0] != fingerprint:
            raise RuntimeError("the instances' calls differ")

    def agreed_bcast():
        if rank == 0:
            sent_payload[...] = x
        exchange()
        return x.copy() if rank == 0 else got_payload.copy()

    def agreed_sum():
        sent_payload[...] = x
        exchange()
        return np.add(x, got_payload) if rank == 0 else np.add(got_payload, x)

    def bcast_fresh():
        b = x.copy() if rank == 0 else np.empty_like(x)
        comm.Bcast(b, 0)
        return b

    def allreduce_fresh():
        b = np.empty_like(x)
        comm.Allreduce(x, b)
        return b

    fns = {"bcast fresh": bcast_fresh, "bcast in-place": lambda: comm.Bcast(out, 0),
           "agreed bcast": agreed_bcast, "allreduce fresh": allreduce_fresh,
           "allreduce in-place": lambda: comm.Allreduce(x, out), "agreed sum": agreed_sum,
           "fingerprint Allgather": lambda: comm.Allgather(block, blocks),
           "fingerprint Allreduce MIN": lambda: comm.Allreduce(block, least, op=MPI.MIN),
           "Barrier": comm.Barrier}
    if not pair:  # (the persistent exchange above is between two)
        del fns["agreed bcast"], fns["agreed sum"]
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = random.Random(0)
    for fn in fns.values():
        fn()
    for _ in range(args.rounds):
        names = list(fns)
        order.shuffle(names)  # (the same order on both instances: the same seed)
        for name in names:
            fn = fns[name]
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            times[name].append((time.perf_counter() - start) / args.calls)
    if pair:
        receive.Free()
        post.Free()
    us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    if rank == 0:
        print(f"# {args.bytes} bytes, {comm.size} instances, medians of {args.rounds} rounds "
              f"of {args.calls} calls (us per call)")
        for name, t in us.items():
            print(f"{name:26s} {t:8.2f}")
        print(f"fingerprint Allgather / bcast fresh: "
              f"{us['fingerprint Allgather'] / us['bcast fresh']:.2f}x")
        if not pair:
            return 0
        print(f"agreed bcast / bcast in-place: {us['agreed bcast'] / us['bcast in-place']:.2f}x"
              f", / bcast fresh: {us['agreed bcast'] / us['bcast fresh']:.2f}x")
        print(f"agreed sum / allreduce in-place: "
              f"{us['agreed sum'] / us['allreduce in-place']:.2f}x, / allreduce fresh: "
              f"{us['agreed sum'] / us['allreduce fresh']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
