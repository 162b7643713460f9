"""Start and supervise a job through MPICH's ``mpirun`` (Hydra).

Each instance is one MPMD block with its own environment
(``mpirun -n 1 -env K V prog : -n 1 -env K V2 prog``). Python programs run under
:mod:`launch.bootstrap`, so a failing instance ends the job at once; Hydra then stops the
others. Each instance's stdout and stderr go to files that poprun follows and tags by line.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence, TextIO

from launch import env as envnames
from launch.errorfile import read_error_file
from launch.errors import InstanceFailedError, InstanceFailure, LaunchError
from launch.output import FileTailer, LineTagger, instance_output_paths, stream_writer
from launch.plan import LaunchPlan
from launch.supervise import GRACE_PERIOD_S  # noqa: F401 - the grace period, re-exported
from launch.supervise import die_with_parent, forward_signals, root_cause

logger = logging.getLogger(__name__)

_PYTHON = re.compile(r"python[0-9.]*$")
_FLAGS_WITH_ARG = ("-X", "-W")
_EXIT_CODES = re.compile(r"Exit codes: \[[^\]]*\] ([0-9,]+)")
# Hydra's banner names the process whose end made it stop the job.
_BAD_PID = re.compile(r"PID (\d+) RUNNING AT")


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


def instance_command(command: Sequence[str]) -> list[str]:
    """``command``, with a Python program run under :mod:`launch.bootstrap`.

    ``python [interpreter options] (script | -m mod | -c cmd) args`` becomes
    ``python [interpreter options] -m launch.bootstrap (script | -m mod | -c cmd) args``;
    any other program is left as it is (it gets no fail-fast guarantee beyond mpirun's).
    A bare ``python``/``python3`` (no directory) means the interpreter running poprun, the
    one ipupod is installed in, whether or not its environment is activated.
    """
    command = list(command)
    if not command or not _PYTHON.match(os.path.basename(command[0])):
        return command
    if os.sep not in command[0]:
        command[0] = sys.executable
    i = 1
    while i < len(command) and command[i].startswith("-") and command[i] not in ("-m", "-c"):
        i += 2 if command[i] in _FLAGS_WITH_ARG else 1
    if i >= len(command):
        return command  # an interactive interpreter: nothing to wrap
    return [*command[:i], "-m", "launch.bootstrap", *command[i:]]


def _read_pid(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


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
        """The full mpirun command for ``plan``, writing output files into ``workdir``."""
        cmd = [self.mpirun, "-print-all-exitcodes",
               "-outfile-pattern", os.path.join(workdir, "out.%r"),
               "-errfile-pattern", os.path.join(workdir, "err.%r"),
               "-genv", "PYTHONUNBUFFERED", "1"]
        program = instance_command(plan.command)
        for k, placement in enumerate(plan.instances):
            if k:
                cmd.append(":")
            cmd += ["-n", "1"]
            error_file = os.path.join(workdir, f"error.{placement.index}.json")
            for name, value in envnames.instance_env(plan, placement, error_file).items():
                cmd += ["-env", name, value]
            cmd += program
        return cmd

    def run(self, plan: LaunchPlan) -> int:
        """Run the job to its end.

        Returns:
            0 when every instance succeeded.

        Raises:
            InstanceFailedError: an instance failed (the others were stopped).
            LaunchError: mpirun could not be started.
        """
        workdir = tempfile.mkdtemp(prefix="poprun-")
        try:
            return self._run(plan, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _run(self, plan: LaunchPlan, workdir: str) -> int:
        out, err = stream_writer(self.stdout), stream_writer(self.stderr)
        sources = []
        for p in plan.instances:
            out_path, err_path = instance_output_paths(workdir, p.index)
            sources.append((out_path, LineTagger(f"[1,{p.index}]<stdout>:", out)))
            sources.append((err_path, LineTagger(f"[1,{p.index}]<stderr>:", err)))
        cmd = self.command_line(plan, workdir)
        logger.info("Running command: %s", " ".join(cmd))
        try:
            proc = self.spawn(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        except OSError as exc:
            raise LaunchError(f"could not start {self.mpirun}: {exc}") from exc
        tailer = FileTailer(sources).start()
        statuses: list[int] = []
        first_bad: dict[str, float] = {}
        relay = threading.Thread(target=self._relay,
                                 args=(proc.stdout, err, statuses, first_bad), daemon=True)
        relay.start()
        with forward_signals(proc.send_signal, proc.kill, lambda: proc.poll() is None):
            try:
                returncode = proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        relay.join(timeout=10)
        tailer.stop()
        failures = self._failures(plan, workdir, statuses, first_bad)
        if returncode == 0 and not failures:
            return 0
        if not failures:
            failures = [InstanceFailure(instance=-1, exit_code=returncode)]
        raise InstanceFailedError(root_cause(failures), failures)

    def _relay(self, pipe, write, statuses: list[int], first_bad: dict[str, float]) -> None:
        """Pass mpirun's own messages on (untagged), keeping its exit-code list and the pid
        (with the time it was reported) of the process whose end stopped the job."""
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace")
            bad = _BAD_PID.search(line)
            if bad and not first_bad:
                first_bad[bad.group(1)] = time.time()
            match = _EXIT_CODES.search(line)
            if match:
                statuses.extend(int(s) for s in match.group(1).split(","))
                continue
            write(line)
        pipe.close()

    def _failures(self, plan: LaunchPlan, workdir: str, statuses: list[int],
                  first_bad: dict[str, float]) -> list[InstanceFailure]:
        """Every failed instance: from its error file, else from mpirun's exit codes. The
        instance whose end made mpirun stop the job (its pid in mpirun's banner) gets the
        time mpirun reported it, so it is the root cause unless an error file came first."""
        failures = []
        for p in plan.instances:
            error_file = os.path.join(workdir, f"error.{p.index}.json")
            recorded = read_error_file(error_file)
            if recorded is not None:
                failures.append(recorded)
            elif p.index < len(statuses) and statuses[p.index]:
                code, sig = _decode_status(statuses[p.index])
                when = first_bad.get(_read_pid(f"{error_file}.pid"))
                failures.append(InstanceFailure(p.index, exit_code=code, signal=sig, time=when))
        return failures
