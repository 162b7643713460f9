"""How many times the MPI agreement looks for a peer's notice after an agreement whose
blocks were all there at once (:func:`collectives.transports.mpi.agreement.quiet_s`), on a
communicator of this one instance (``MPI.COMM_SELF``: no rounds, so no wait), with a
stand-in clock and transport. Prints ``LOOKS <n> <n> ...``, one per agreement.

    python -m tests.programs.notice_looks TIMEOUT_S STEP_S [STEP_S ...]

The first agreement learns its layout (the general loop: three looks); agreement i + 1
starts ``STEP_S[i]`` seconds after agreement i.
"""

from __future__ import annotations

import sys

from mpi4py import MPI

from collectives.options import CollectiveOptions
from collectives.transports.mpi import agreement as mpi_agreement
from collectives.waiting import Patience


class _Transport:
    def __init__(self, timeout_s: float):
        self.options = CollectiveOptions(timeout_s=timeout_s)
        self.looks: list[int] = []

    def check_notices(self, polls: int = 1) -> None:
        self.looks.append(polls)


def main(timeout_s: float, steps: list[float]) -> int:
    now = [1000.0]
    mpi_agreement._clock = lambda: now[0]
    transport = _Transport(timeout_s)
    rounds = mpi_agreement.Rounds(transport, (0,), 0)
    patience = Patience("test", transport.options, lambda: "nobody")
    for step in [0.0] + steps:
        now[0] += step
        agreed, _ = rounds.agree_gather(MPI.COMM_SELF, 12345, None, patience)
        assert agreed
    print("LOOKS", *transport.looks, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), [float(a) for a in sys.argv[2:]]))
