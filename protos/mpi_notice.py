"""The notices of the MPI transport: what an instance of an MPI job tells every other one
when it gives up on the job's collectives or ends its program. Both ends share these
constants: :mod:`collectives.transports.mpi.transport` (sends and receives them) and
:mod:`launch.bootstrap` (an instance whose program ended before it started MPI).

A notice is a point-to-point message on ``MPI_COMM_WORLD`` under tag :data:`TAG`,
:data:`NBYTES` bytes: its reason as UTF-8, zero-padded. The reason :data:`ENDED` says that
the sender's program has ended (it takes part in no further collective); any other reason
says why it gave up (a timeout, a failure). Nothing is pickled.
"""

#: the tag of a notice, on MPI_COMM_WORLD (a program that receives there with
#: MPI.ANY_TAG while collectives run could take one)
TAG = 0x1A16
#: bytes of a notice: its reason, UTF-8, zero-padded
NBYTES = 256
#: the reason of an instance whose program has ended
ENDED = "ended its program"
#: seconds an instance whose program has ended waits for the others at the end of the job
#: before it sends :data:`ENDED` (ipupod assumption: longer than instances that end
#: together take to meet there; when all end together no notice is sent, so that none is
#: in flight at MPI_Finalize, where MPICH may wait in a PMI barrier that Hydra takes for a
#: failed job when some instance has left without it)
ENDED_AFTER_S = 0.5


def encode(reason: str) -> bytearray:
    """A notice of ``reason`` (cut to :data:`NBYTES` bytes)."""
    text = reason.encode("utf-8", "replace")[:NBYTES]
    return bytearray(text.ljust(NBYTES, b"\0"))


def decode(data) -> str:
    """The reason of a received notice (bytes-like of :data:`NBYTES`)."""
    return bytes(data).rstrip(b"\0").decode("utf-8", "replace")
