"""The transport conformance suite (collectives.testing) on the MPI transport of this job.

    poprun -n N python -m tests.programs.conformance

Prints ``CONFORMANCE <check>`` per passed check and ``CONFORMANCE done`` at the end.
"""

from __future__ import annotations

import sys

from collectives.options import CollectiveOptions
from collectives.testing import check_communicator
from collectives.transports import create_transport
from poprun import popdist


def main() -> int:
    transport = create_transport("mpi", popdist.getInstanceIndex(), popdist.getNumInstances(),
                                 options=CollectiveOptions(timeout_s=10))
    check_communicator(transport, timeout_s=2.0,
                       log=lambda name: print(f"CONFORMANCE {name}", flush=True))
    print("CONFORMANCE done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
