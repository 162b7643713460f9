"""Exceptions of the emulated IPU system, one class per cause."""


class IPUError(Exception):
    """Base class of every error raised by :mod:`ipu_node`."""


class IPUConfigError(IPUError, ValueError):
    """An :class:`~ipu_node.IPUConfig` does not describe a usable system (says which option)."""


class NotConfiguredError(IPUError, RuntimeError):
    """The IPU system is used before ``IPUConfig.configure_ipu_system()`` was called."""


class AlreadyConfiguredError(IPUError, RuntimeError):
    """``configure_ipu_system()`` was called while replicas of the current system run."""


class NotInReplicaError(IPUError, RuntimeError):
    """A per-replica operation was called outside of a replica function."""


class UnknownSystemError(IPUConfigError):
    """A system name that is not in the registry (the message lists the known names)."""


class UnknownIPUError(IPUConfigError):
    """An IPU id that the system does not have (the message gives the valid range)."""


class UnknownDeviceError(IPUConfigError):
    """A ``gc-info`` device id that the system does not have (the message gives the range)."""


class NotEnoughIPUsError(IPUConfigError):
    """A request for more IPUs (or a device size) than the system can give."""


class IPUBusyError(IPUError, RuntimeError):
    """An IPU is attached by another process (the message names the IPU and the holder)."""


class IPUOutOfMemoryError(IPUError, MemoryError):
    """A tensor does not fit in an IPU's In-Processor-Memory.

    Attributes:
        ipu_id: the IPU.
        needed_bytes: bytes the new tensor needs.
        available_bytes: bytes still free on the IPU.
        largest: ``(name, nbytes)`` of the largest tensors on the IPU, largest first.
    """

    def __init__(self, message: str, *, ipu_id: int, needed_bytes: int,
                 available_bytes: int, largest: list[tuple[str, int]]):
        super().__init__(message)
        self.ipu_id = ipu_id
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.largest = largest


class InvalidArgumentError(IPUError, ValueError):
    """A tensor the device cannot take (TF's ``InvalidArgumentError``), e.g. a feed element
    with a dimension of size 0."""


class FailedPreconditionError(IPUError, RuntimeError):
    """An operation run in a state that does not allow it (TF's ``FailedPreconditionError``),
    e.g. the last value of an outfeed taken before anything was enqueued."""


class OutOfRangeError(IPUError, RuntimeError):
    """A feed asked for more elements than its dataset has left (TF's ``OutOfRangeError``;
    on the hardware a fatal error [004:2552]). The message names the feed, the replica and the
    iteration."""


class NotPlacedOnIPUError(IPUError, RuntimeError):
    """``ipu_compiler.compile`` called outside ``ipu_scope('/device:IPU:0')`` and outside a
    strategy's scope: the computation would not run on an IPU [004:39-41]."""


class OccupancyDirError(IPUError, OSError):
    """The directory of the IPU lock files cannot be used safely: it cannot be created, is
    not a directory, belongs to another user or is open to others (names it and why)."""


class DeviceNotAttachedError(IPUError, RuntimeError):
    """A program asked to run on IPUs that ``device_connection.type`` (NEVER or
    PRE_COMPILE) left unattached (names the option)."""


class IPUFloatingPointError(IPUError, FloatingPointError):
    """A floating-point exception inside a replica function that
    ``IPUConfig.floating_point_behaviour`` (inv, div0, oflo or set_all) asked to raise, as
    the IPU's exception stops the program (names the event and the option)."""


class WiderReplicasNeeded(IPUError, RuntimeError):
    """A pipeline needs more IPUs per replica than the replicas have, and the replication
    factor is still derived (``ipus_per_replica`` unset, nothing bound to the layout): the
    runner that catches it (``strategy.run``) widens the replicas to :attr:`shards` IPUs
    with :func:`ipu_node.runtime.system.widen_replicas` and runs the function again.

    Attributes:
        shards: IPUs each replica needs.
    """

    def __init__(self, message: str, shards: int):
        super().__init__(message)
        self.shards = shards
