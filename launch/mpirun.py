"""Start and supervise a job through MPICH's ``mpirun`` (Hydra).

Each instance is one MPMD block with its own environment
(``mpirun -n 1 -env K V prog : -n 1 -env K V2 prog``). Every program runs under a guard of
:mod:`launch.bootstrap` that records how an instance failed in its error file, however it
ended (an exception, ``os._exit``, a signal), so that poprun stops the others at once: Hydra
itself ends a job only when a process that started MPI fails. Each instance's stdout and
stderr go to files that poprun follows and tags by line.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

from launch.errorfile import any_error_file, read_error_file
from launch import env as envnames
from launch.errors import InstanceFailedError, InstanceFailure, JobInterruptedError, LaunchError
from launch.hydra import error_file_path, mpirun_command_line, mpirun_environment
from launch.output import FileTailer, LineTagger, instance_output_paths, stream_writer
from launch.plan import LaunchPlan
from launch.supervise import GRACE_PERIOD_S  # noqa: F401 - the grace period, re-exported
from launch.supervise import (check_program, die_with_parent, forward_signals, kill_tree,
                              make_workdir, root_cause)

logger = logging.getLogger(__name__)

_PYTHON = re.compile(r"python[0-9.]*$")
_FLAGS_WITH_ARG = ("-X", "-W")
_EXIT_CODES = re.compile(r"Exit codes: \[[^\]]*\] ([0-9,]+)")


def find_mpirun() -> str:
    """The ``mpirun`` of the MPICH installed with this Python (the ``mpich`` wheel puts it
    beside the interpreter).

    Raises:
        LaunchError: none is there (says how to install it).
    """
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = directory / "mpirun"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise LaunchError(f"mpirun was not found next to {sys.executable}; install MPICH into "
                      "this environment with: pip install mpich mpi4py")


def instance_command(command: Sequence[str], guard: bool = False) -> list[str]:
    """``command``, with a Python program run under :mod:`launch.bootstrap`.

    ``python [interpreter options] (script | -m mod | -c cmd) args`` becomes
    ``python [interpreter options] -m launch.bootstrap (script | -m mod | -c cmd) args``;
    any other program is left as it is. With ``guard`` (mpirun, which does not end a job when
    an instance that has not started MPI exits non-zero or is killed) a Python program runs
    under ``python -m launch.bootstrap --guard``, which forks and keeps a guard process that
    waits for it, and any other program under ``python -m launch.bootstrap --exec``: either
    guard records how the program ended (an ``os._exit``, a signal, an exit code) in the error
    file that the launcher watches, so the launcher stops the job at once.
    A bare ``python``/``python3`` (no directory) means the interpreter running poprun, the
    one ipupod is installed in, whether or not its environment is activated.
    """
    command = list(command)
    if not command or not _PYTHON.match(os.path.basename(command[0])):
        if guard and command:
            return [sys.executable, "-m", "launch.bootstrap", "--exec", *command]
        return command
    if os.sep not in command[0]:
        command[0] = sys.executable
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] not in ("-m", "-c"):
        i += 2 if command[i] in _FLAGS_WITH_ARG else 1
    if i >= len(command):
        return command  # an interactive interpreter: nothing to wrap
    return [*command[:i], "-m", "launch.bootstrap", *(["--guard"] if guard else []),
            *command[i:]]


_SHM_DIR = "/dev/shm"
_MPICH_SEGMENT = "mpich_shm_"


def _mpich_segments() -> set[str]:
    try:
        return {name for name in os.listdir(_SHM_DIR) if name.startswith(_MPICH_SEGMENT)}
    except OSError:
        return set()


def mapped_shm_names(prefix: str = _MPICH_SEGMENT) -> set[str]:
    """Names in /dev/shm starting with ``prefix`` that some live process has mapped (read
    from every readable ``/proc/<pid>/maps``)."""
    mapped = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    where = line.find(_SHM_DIR + "/" + prefix)
                    if where >= 0:
                        mapped.add(line[where + len(_SHM_DIR) + 1:].split()[0])
        except OSError:
            continue
    return mapped


def remove_leftover_segments(before: set[str]) -> list[str]:
    """Unlink MPICH shared-memory segments a failed job left in /dev/shm.

    MPICH unlinks its segments in ``MPI_Finalize``, which instances that fail never reach
    (the bootstrap ends them with ``os._exit``; mpirun kills the rest), so every failed job
    would leave megabytes of memory behind. Removed: segments that appeared since ``before``
    (taken when the job started) and that no live process maps any more.

    Returns:
        The names removed.
    """
    removed = []
    new = _mpich_segments() - before
    for name in sorted(new - mapped_shm_names() if new else ()):
        try:
            os.unlink(os.path.join(_SHM_DIR, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _unknown_order(failures: list[InstanceFailure]) -> InstanceFailure:
    """Several instances died of signals and none said why: mpirun stops the others with
    signals too, and a killed process takes a while to end, so which went first cannot be
    known from outside. Say so, naming every one, instead of guessing."""
    names = ", ".join(str(f.instance) for f in failures)
    signals = sorted({f.signal for f in failures if f.signal})
    codes = sorted({f.exit_code for f in failures if not f.signal})
    how = " or ".join([_signal_name(s) for s in signals]
                      + [f"exit code {c}" for c in codes]) or "an error"
    return InstanceFailure(-1, exit_code=failures[0].exit_code, signal=failures[0].signal,
                           error=f"instances {names} {'ended with' if codes else 'were killed by'} "
                                 f"{how}; mpirun ends the other instances with signals, so "
                                 "which failed first is unknown")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


#: seconds mpirun gets to end the job itself once an instance recorded a failure, before
#: poprun sends it SIGTERM (Hydra does not end a job whose instance exits non-zero without
#: having called MPI_Init: a program that fails before its first collective)
STOP_WAIT_S = 1.0
#: seconds between checks of the job (mpirun alive? an error file written?)
POLL_INTERVAL_S = 0.05


def supervise_mpirun(proc: subprocess.Popen, workdir: str, signals: forward_signals,
                     stop_wait_s: float = STOP_WAIT_S,
                     grace_s: float = GRACE_PERIOD_S) -> int:
    """Wait for mpirun to end; returns its exit status (negative: killed by that signal).

    Once an instance has written its error file (``error.<i>.json`` in ``workdir``, by
    :mod:`launch.bootstrap`), mpirun gets ``stop_wait_s`` to end the job, then SIGTERM
    (Hydra passes it on to every instance), then after ``grace_s`` mpirun and everything
    under it get SIGKILL. While ``signals`` handles a signal sent to poprun, it owns the
    escalation instead.
    """
    stop_at = kill_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if stop_at is None and signals.received is None and any_error_file(workdir):
            stop_at = now + stop_wait_s
        if kill_at is None and stop_at is not None and now >= stop_at:
            logger.info("an instance failed and mpirun did not end the job: stopping it")
            proc.send_signal(signal.SIGTERM)
            kill_at = now + grace_s
        if kill_at is not None and now >= kill_at:
            kill_tree(proc.pid)
            kill_at = float("inf")
        time.sleep(POLL_INTERVAL_S)
    return proc.returncode


def _mpirun_failure(returncode: int) -> InstanceFailure:
    """The job's failure when no instance said why: mpirun's own status (a negative status
    is the signal that killed mpirun, never reported as an exit code)."""
    if returncode < 0:
        return InstanceFailure(instance=-1, signal=-returncode,
                               error=f"mpirun was killed by {_signal_name(-returncode)}")
    return InstanceFailure(instance=-1, exit_code=returncode)


def _decode_status(status: int) -> tuple[int, int]:
    """A wait status from Hydra's exit-code list as (exit code, signal)."""
    if status & 0x7F:
        return 0, status & 0x7F
    return status >> 8, 0


class MpirunBackend:
    """Runs a :class:`LaunchPlan` with mpirun and supervises it.

    Args:
        mpirun: path of mpirun (default: :func:`find_mpirun`).
        stdout, stderr: where tagged instance output goes.
        spawn: creates the mpirun process (``subprocess.Popen`` signature); injectable.
    """

    def __init__(self, mpirun: str | None = None, stdout: TextIO | None = None,
                 stderr: TextIO | None = None, spawn: Callable[..., subprocess.Popen] = subprocess.Popen):
        self.mpirun = mpirun or find_mpirun()
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.spawn = spawn

    def command_line(self, plan: LaunchPlan, workdir: str) -> list[str]:
        """The full mpirun command for ``plan``, writing output files into ``workdir``
        (:func:`launch.hydra.mpirun_command_line`; no secret is on it)."""
        return mpirun_command_line(plan, self.mpirun, workdir, instance_command(plan.command, guard=True))

    def environment(self, plan: LaunchPlan) -> dict[str, str]:
        """mpirun's environment for ``plan``: poprun's, plus what every instance gets
        alike, the job token among them (:func:`launch.hydra.mpirun_environment`)."""
        env = mpirun_environment(plan, os.environ)
        env.pop(envnames.PARENT_PID, None)   # an outer launcher's: not this job's parent
        return env

    def run(self, plan: LaunchPlan) -> int:
        """Run the job to its end.

        Returns:
            0 when every instance succeeded.

        Raises:
            InstanceFailedError: an instance failed (the others were stopped).
            LaunchError: mpirun could not be started.
        """
        check_program(instance_command(plan.command))
        workdir = make_workdir()
        try:
            return self._run(plan, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _run(self, plan: LaunchPlan, workdir: str) -> int:
        out, err = stream_writer(self.stdout), stream_writer(self.stderr)
        sources = []
        for p in plan.instances:
            if plan.only_output_from_instance not in (None, p.index):
                continue  # --only-output-from-instance: the others' files are not followed
            out_path, err_path = instance_output_paths(workdir, p.index)
            sources.append((out_path, LineTagger(f"[1,{p.index}]<stdout>:", out)))
            sources.append((err_path, LineTagger(f"[1,{p.index}]<stderr>:", err)))
        cmd = self.command_line(plan, workdir)
        logger.info("Running command: %s", " ".join(cmd))
        segments_before = _mpich_segments()
        env = self.environment(plan)
        # the handlers are in place before mpirun starts (as in the local backend): a signal
        # that comes while it is starting reaches it once it is there
        started: list[subprocess.Popen] = []
        signals = forward_signals(lambda signum: [p.send_signal(signum) for p in started],
                                  lambda: [kill_tree(p.pid) for p in started],
                                  lambda: any(p.poll() is None for p in started))
        with signals:
            try:
                proc = self.spawn(cmd, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  preexec_fn=die_with_parent)
            except OSError as exc:
                raise LaunchError(f"could not start {self.mpirun}: {exc}") from exc
            started.append(proc)
            if signals.received is not None:
                proc.send_signal(signals.received)
            tailer = FileTailer(sources).start()
            statuses: list[int] = []
            relay = threading.Thread(target=self._relay, args=(proc.stdout, err, statuses),
                                     daemon=True)
            relay.start()
            try:
                returncode = supervise_mpirun(proc, workdir, signals)
            finally:
                if proc.poll() is None:
                    kill_tree(proc.pid)
                    proc.wait()
        relay.join(timeout=10)
        tailer.stop()
        failures = self._failures(plan, workdir, statuses)
        removed = remove_leftover_segments(segments_before)
        if removed:
            logger.info("removed %d shared-memory segments the job left: %s",
                        len(removed), ", ".join(removed))
        if signals.received is not None:
            raise JobInterruptedError(signals.received, signals.killed, signals.grace_s)
        if returncode == 0 and not failures:
            return 0
        if not failures:
            failures = [_mpirun_failure(returncode)]
        if len(failures) > 1 and all(f.time is None for f in failures):
            raise InstanceFailedError(_unknown_order(failures), failures)
        raise InstanceFailedError(root_cause(failures), failures)

    def _relay(self, pipe, write, statuses: list[int]) -> None:
        """Pass mpirun's own messages on (untagged), keeping its exit-code list."""
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace")
            match = _EXIT_CODES.search(line)
            if match:
                statuses.extend(int(s) for s in match.group(1).split(","))
                continue
            write(line)
        pipe.close()

    def _failures(self, plan: LaunchPlan, workdir: str,
                  statuses: list[int]) -> list[InstanceFailure]:
        """The instances' recorded failures, and the unrecorded ends in Hydra's statuses. An
        unrecorded death by a signal after another instance recorded its failure is left out:
        every instance runs under the bootstrap's guard, which records its own instance's
        death by a signal, so such a death is Hydra stopping the job."""
        recorded = {p.index: read_error_file(error_file_path(workdir, p.index))
                    for p in plan.instances}
        any_recorded = any(f is not None for f in recorded.values())
        failures = []
        for p in plan.instances:
            if recorded[p.index] is not None:
                failures.append(recorded[p.index])
            elif p.index < len(statuses) and statuses[p.index]:
                code, sig = _decode_status(statuses[p.index])
                if not (sig and any_recorded):
                    failures.append(InstanceFailure(p.index, exit_code=code, signal=sig))
        return failures
