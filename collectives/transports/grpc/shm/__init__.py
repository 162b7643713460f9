"""The shared-memory rings of the gRPC transport: the ring of one pair of peers
(:mod:`~collectives.transports.grpc.shm.channel`), the fan-out of one writer to several
readers (:mod:`~collectives.transports.grpc.shm.fanout`), their records
(:mod:`~collectives.transports.grpc.shm.records`) and the hand-over of their memory between
processes of one job and user (:mod:`~collectives.transports.grpc.shm.handover`)."""
