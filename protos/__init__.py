"""protos: wire formats of ipupod's gRPC services, and the constants both ends share.

``coordinator.proto`` (rendezvous, barrier, heartbeat, abort) and ``peer.proto`` (tensor
exchange in chunks) with their generated modules ``*_pb2.py``/``*_pb2_grpc.py``, produced by
``python -m protos.generate`` (grpcio-tools) and kept in the repository; a test fails when
they are stale. Importing this package loads neither grpc nor protobuf.
"""

#: metadata key of the job token that every call carries
TOKEN_METADATA_KEY = "ipupod-job-token"

#: bytes of tensor payload per chunk (the proto allows 1-4 MiB; 1 MiB measured fastest here)
CHUNK_BYTES = 1 << 20
#: largest payload a chunk may carry, bytes
MAX_CHUNK_BYTES = 4 << 20
#: largest message a server accepts, bytes: one chunk and its header (gRPC refuses more)
MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + (64 << 10)
#: largest coordinator message, bytes
MAX_CONTROL_MESSAGE_BYTES = 1 << 20

#: server options every ipupod gRPC server uses: bounded messages, and no SO_REUSEPORT, so a
#: port already in use is an error instead of two servers sharing it (and a silent hang)
def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """gRPC server options: receive limit ``max_message_bytes`` (bytes), SO_REUSEPORT off."""
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0)]


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """gRPC channel options: send/receive limit ``max_message_bytes`` (bytes)."""
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.enable_retries", 0)]
