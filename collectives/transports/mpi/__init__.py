"""The MPI transport: mpi4py buffer methods on raw bytes, every call nonblocking and polled.

* :mod:`~collectives.transports.mpi.transport`: :class:`MPITransport`, the job's
  communicators, and the notices of instances that give up or end their program;
* :mod:`~collectives.transports.mpi.communicator`: the communicator of a set of instances;
* :mod:`~collectives.transports.mpi.agreement`: every call's agreement (Bruck's rounds), and
  :mod:`~collectives.transports.mpi.index`, the agreement that sends each member its piece;
* :mod:`~collectives.transports.mpi.requests`: the handles of the operations, and data
  posted before its call's agreement.

Nothing here is imported until the MPI transport is created (it loads mpi4py).
"""
