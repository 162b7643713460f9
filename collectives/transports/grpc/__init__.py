"""The gRPC transport: peer-to-peer over gRPC, bulk bytes between peers of one host through
shared-memory rings.

* :mod:`~collectives.transports.grpc.transport`: :class:`GrpcTransport`;
* :mod:`~collectives.transports.grpc.communicator`: the communicator of a set of instances
  and its agreement;
* :mod:`~collectives.transports.grpc.coordinator`: the client of the job's coordinator;
* :mod:`~collectives.transports.grpc.peer`, :mod:`~collectives.transports.grpc.sender`,
  :mod:`~collectives.transports.grpc.mailbox`, :mod:`~collectives.transports.grpc.wire`:
  the requests (what moves between peers, and how it is framed);
* :mod:`~collectives.transports.grpc.rings` and :mod:`collectives.transports.grpc.shm`: the
  shared-memory rings.

Nothing here is imported until the gRPC transport is created (it loads grpc).
"""
