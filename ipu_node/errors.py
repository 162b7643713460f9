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
