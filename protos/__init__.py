"""protos: wire formats of ipupod's gRPC services, and the constants both ends share.

``coordinator.proto`` (rendezvous, barrier, heartbeat, abort) and ``peer.proto`` (tensor
exchange in chunks) with their generated modules ``*_pb2.py``/``*_pb2_grpc.py``, produced by
``python -m protos.generate`` (grpcio-tools) and kept in the repository; a test fails when
they are stale. Importing this package loads neither grpc nor protobuf.

PYTEST_DONT_REWRITE: imported by the bootstrap before a program under poprun starts pytest
(see ``launch``).
"""

import os

#: gRPC's own fork handlers are off unless the user set them: every fork in ipupod's processes
#: is followed by ``exec`` (poprun starts mpirun and the bootstrap its program through a
#: ``preexec_fn``, which makes Python fork instead of vfork). With them on (grpcio's default),
#: the forked child restarts gRPC's poller thread before ``exec``, and that thread aborts the
#: child once ``close_fds`` has closed its epoll descriptor ("epoll_wait error: Bad file
#: descriptor", grpc/grpc#43055): with grpcio 1.85.4 here, 4 of 150 such children of a busy
#: gRPC process died of SIGABRT, 0 of 150 with them off. This module is imported before any
#: gRPC channel or server is made (gRPC reads the variable then).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

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


class ServingExecutor:
    """A thread pool for gRPC servers that keeps serving while the interpreter exits.

    ``concurrent.futures.ThreadPoolExecutor`` refuses new work once interpreter shutdown has
    begun, before ``atexit`` handlers run; but an instance's last calls (a goodbye to the
    coordinator that worker 0 hosts, its wait for the others to leave) happen exactly then.
    These daemon threads serve until the process ends.

    Args:
        max_workers: threads, each serving one call at a time.
        name: thread name prefix.
    """

    def __init__(self, max_workers: int, name: str = "grpc-server"):
        import queue
        import threading

        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(max_workers)]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the future
                future.set_exception(exc)

    def submit(self, fn, /, *args, **kwargs):
        from concurrent.futures import Future

        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
