"""PopTorch's exception classes (poptorch reference §1).

``poptorch.Error`` is the base; ``RecoverableError`` and ``UnrecoverableError`` derive from it.
Errors raised by the Python side are built by :func:`createPoptorchError`, whose ``str()`` is
``'poptorch_py_error': <msg>`` as PopTorch's (PT python/_impl.py:67) and whose ``.message`` is
the message alone.
"""

from __future__ import annotations

__all__ = ["Error", "RecoverableError", "UnrecoverableError", "ConfigFileError",
           "createPoptorchError"]


class Error(Exception):
    """A PopTorch error.

    Attributes:
        message: the message alone.
        type: where it comes from (``poptorch_py_error`` for the Python side,
            ``ipupod_error`` for the emulated device: attach, memory).
        location: where it was raised (empty: ipupod keeps no C++ stack).
    """

    def __init__(self, message: str, type: str = "poptorch_py_error",  # noqa: A002 PopTorch's
                 location: str = ""):
        super().__init__(f"'{type}': {message}")
        self.message = message
        self.type = type
        self.location = location


class RecoverableError(Error):
    """An error after which the device can be used again once ``recovery_action`` is done
    (one of ``IPU_RESET``, ``LINK_RESET``, ``PARTITION_RESET``, ``FULL_RESET``). The
    emulation raises none itself; the class exists for programs that catch it."""

    def __init__(self, message: str, recovery_action: str = "IPU_RESET", **kwargs):
        super().__init__(message, **kwargs)
        self.recovery_action = recovery_action


class UnrecoverableError(Error):
    """An error after which the device cannot be used again (none raised by the emulation;
    the class exists for programs that catch it)."""


class ConfigFileError(Exception):
    """A line of an options file (``Options.loadFromFile``) that is not valid Python."""


def createPoptorchError(message: str) -> Error:
    """The :class:`Error` the Python side of PopTorch raises (``str()`` is
    ``'poptorch_py_error': <message>``)."""
    return Error(message)
