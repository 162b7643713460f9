"""Exceptions of the launcher."""

from __future__ import annotations

from dataclasses import dataclass


class LaunchError(RuntimeError):
    """The job could not be started (e.g. no mpirun); says what to do."""


@dataclass(frozen=True)
class InstanceFailure:
    """How one instance failed.

    Attributes:
        instance: instance index; -1 when the failure is the job's as a whole (``error``
            then says what is known).
        exit_code: its exit code (0 when it died by a signal).
        signal: the signal number that ended it, or 0.
        error: ``"ValueError: boom"`` when the program raised, else "".
        time: wall-clock time of the failure (seconds since the epoch), or None if unknown.
    """

    instance: int
    exit_code: int = 0
    signal: int = 0
    error: str = ""
    time: float | None = None

    def describe(self) -> str:
        import signal as _signal
        if self.signal:
            try:
                name = _signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            how = f"killed by {name}"
        else:
            how = f"exit code {self.exit_code}"
        if self.instance < 0:  # not one instance: the job as a whole
            return self.error or f"the job failed ({how})"
        return f"instance {self.instance} failed ({how})" + (f": {self.error}" if self.error else "")


class InstanceFailedError(RuntimeError):
    """An instance of the job failed; the others were stopped.

    Attributes:
        root_cause: the first failure (earliest in time where known).
        failures: every failure observed.
    """

    def __init__(self, root_cause: InstanceFailure, failures: list[InstanceFailure]):
        super().__init__(root_cause.describe())
        self.root_cause = root_cause
        self.failures = failures



class JobInterruptedError(LaunchError):
    """poprun received SIGINT or SIGTERM and stopped the job (the instances' own failures
    that followed are consequences, not the cause).

    Attributes:
        signum: the signal poprun received (passed on to the instances).
        killed: whether part of the job was still running ``grace_s`` after the signal was
            passed on and was killed (SIGKILL), e.g. a program that ignores SIGTERM.
        exit_code: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM), as a shell reports it.
    """

    def __init__(self, signum: int, killed: bool = False, grace_s: float = 0.0):
        import signal as _signal
        self.signum, self.killed, self.exit_code = signum, killed, 128 + signum
        name = _signal.Signals(signum).name
        text = f"received {name}; the job was stopped"
        if killed:
            text += (f" (instances still running {grace_s:g} s after {name} were killed with "
                     "SIGKILL)")
        super().__init__(text)
