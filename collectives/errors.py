"""Exceptions of the collectives, one class per cause."""


class CollectiveError(RuntimeError):
    """Base class of every error raised by a collective operation."""


class CollectiveMismatchError(CollectiveError):
    """Replicas called the same collective with different arguments (op, dtype, shape, group)."""


class CollectiveTimeoutError(CollectiveError):
    """Some replicas did not reach a collective within the timeout; names the missing ones."""


class CollectiveAbortedError(CollectiveError):
    """A collective was abandoned because another replica of this instance failed."""


class TransportError(CollectiveError):
    """The transport between instances failed; the cause is ``__cause__``."""


class PeerLostError(TransportError):
    """Another instance of the job died, hung, or aborted the job; names it when known.

    Attributes:
        instance: the lost instance, or -1 when unknown (e.g. the coordinator is gone).
    """

    def __init__(self, message: str, instance: int = -1):
        super().__init__(message)
        self.instance = instance

    @classmethod
    def program_ended(cls, instance: int) -> "PeerLostError":
        """The error of a collective that instance ``instance`` will never call: it ended
        its program while this instance still calls collectives (seen by the MPI transport's
        notice, or by an agreement that met its end of program)."""
        return cls(f"instance {instance} ended its program while this instance still calls "
                   "collectives (every instance must call the same collectives; after an "
                   "instance has ended, none can complete)", instance)


class TransportClosedError(TransportError):
    """The transport was used after :meth:`close` (by this instance)."""


class CollectiveArgumentError(CollectiveError, ValueError):
    """A collective was called with an invalid argument (group size, dimension, root...).

    A ValueError too; being a CollectiveError it does not make the collectives unusable."""


class CollectiveTypeError(CollectiveError, TypeError):
    """A collective was called with an unsupported dtype (names it). A TypeError too."""
