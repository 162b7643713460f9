"""poprun's own launcher: the instances are its child processes, supervised directly.

``poprun --launcher local`` starts one child per instance (Python programs under
:mod:`launch.bootstrap`, as with mpirun), tags their output ``[1,i]<stdout>:`` line by line,
forwards SIGINT/SIGTERM, and supervises them like torchrun's agent: when one instance fails,
``on_failure`` is told at once (poprun aborts the job at the coordinator, so the others raise
an error naming it), the others get :data:`STOP_WAIT_S` to end on their own, then SIGTERM,
then SIGKILL after :data:`~launch.supervise.GRACE_PERIOD_S`. The first failure is the root
cause of the :class:`~launch.errors.InstanceFailedError`. Children die with poprun
(PR_SET_PDEATHSIG, set by the bootstrap), so killing poprun leaves no orphan.
"""

from __future__ import annotations

import enum
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from launch import env as envnames
from launch.errorfile import read_error_file
from launch.errors import InstanceFailedError, InstanceFailure, JobInterruptedError, LaunchError
from launch.mpirun import instance_command
from launch.output import LineTagger, stream_writer
from launch.plan import InstancePlacement, LaunchPlan
from launch.supervise import (GRACE_PERIOD_S, check_program, forward_signals, make_workdir,
                              root_cause)

logger = logging.getLogger(__name__)

#: seconds the other instances get to end on their own after one failed (they learn it from
#: the coordinator and raise an error naming it), before they are sent SIGTERM
STOP_WAIT_S = 2.0
#: seconds between polls of the children
POLL_INTERVAL_S = 0.05

#: ``instance_env(plan, placement, error_file) -> dict``: the variables an instance adds
InstanceEnv = Callable[[LaunchPlan, InstancePlacement, str], dict]


class InstanceState(str, enum.Enum):
    """Where an instance is in its life."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"   # ended by poprun after another instance failed, or by a signal


class _Instance:
    def __init__(self, placement: InstancePlacement, proc: subprocess.Popen, error_file: str):
        self.placement = placement
        self.proc = proc
        self.error_file = error_file
        self.state = InstanceState.RUNNING
        self.failure: InstanceFailure | None = None
        self.readers: list[threading.Thread] = []

    @property
    def index(self) -> int:
        return self.placement.index


class LocalBackend:
    """Runs a :class:`LaunchPlan` as child processes of this one and supervises them.

    Args:
        stdout, stderr: where tagged instance output goes.
        spawn: creates a child (``subprocess.Popen`` signature); injectable.
        instance_env: the variables of each instance (default
            :func:`launch.env.instance_env`; ``launch.multiworker`` passes TF_CONFIG instead).
        on_failure: called once with the first failure, before the others are stopped
            (poprun aborts the job at the coordinator).
        stop_wait_s: seconds the other instances get to end on their own after a failure.
    """

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None,
                 spawn: Callable[..., subprocess.Popen] = subprocess.Popen,
                 instance_env: InstanceEnv = envnames.instance_env,
                 on_failure: Callable[[InstanceFailure], None] | None = None,
                 stop_wait_s: float = STOP_WAIT_S):
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.spawn = spawn
        self.instance_env = instance_env
        self.on_failure = on_failure
        self.stop_wait_s = stop_wait_s
        self.states: dict[int, InstanceState] = {}

    def run(self, plan: LaunchPlan) -> int:
        """Run the job to its end.

        Returns:
            0 when every instance succeeded.

        Raises:
            InstanceFailedError: an instance failed (the others were stopped); names the
                root cause.
            LaunchError: an instance could not be started (the others were stopped).
        """
        check_program(instance_command(plan.command))
        workdir = make_workdir()
        instances: list[_Instance] = []
        signals = forward_signals(lambda s: self._signal_all(instances, s),
                                  lambda: self._signal_all(instances, signal.SIGKILL),
                                  lambda: any(i.proc.poll() is None for i in instances))
        try:
            # the handlers are in place before the first instance starts: a signal that comes
            # while poprun is still starting instances reaches those started, and no more start
            with signals:
                self._start(plan, workdir, instances, signals)
                self._supervise(instances, signals)
        finally:
            self._kill_all(instances)
            for inst in instances:
                for reader in inst.readers:
                    reader.join(timeout=5)
            shutil.rmtree(workdir, ignore_errors=True)
        self.states = {i.index: i.state for i in instances}
        if signals.received is not None:
            raise JobInterruptedError(signals.received, signals.killed, signals.grace_s)
        failures = [i.failure for i in instances if i.failure is not None]
        if not failures:
            return 0
        raise InstanceFailedError(root_cause(failures), failures)

    # -- start --------------------------------------------------------------------------

    def _start(self, plan: LaunchPlan, workdir: str, instances: list[_Instance],
               signals: forward_signals) -> None:
        out, err = stream_writer(self.stdout), stream_writer(self.stderr)
        command = instance_command(plan.command)
        logger.info("Running command: %s (%d instances, as children of poprun)",
                    " ".join(command), plan.num_instances)
        for placement in plan.instances:
            if signals.received is not None:   # poprun was told to stop: start no more
                return
            error_file = os.path.join(workdir, f"error.{placement.index}.json")
            env = dict(os.environ)
            env.update(self.instance_env(plan, placement, error_file))
            env[envnames.PARENT_PID] = str(os.getpid())
            env["PYTHONUNBUFFERED"] = "1"
            try:
                proc = self.spawn(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, start_new_session=True)
            except OSError as exc:
                raise LaunchError(f"could not start instance {placement.index} "
                                  f"({' '.join(command)}): {exc}") from exc
            inst = _Instance(placement, proc, error_file)
            shown = plan.only_output_from_instance in (None, placement.index)
            for pipe, kind, write in ((proc.stdout, "stdout", out), (proc.stderr, "stderr", err)):
                write = write if shown else _discard  # --only-output-from-instance
                tagger = LineTagger(f"[1,{placement.index}]<{kind}>:", write)
                reader = threading.Thread(target=_pump, args=(pipe, tagger), daemon=True,
                                          name=f"poprun-{kind}-{placement.index}")
                reader.start()
                inst.readers.append(reader)
            instances.append(inst)
            if signals.received is not None:
                # the signal came between this instance's start and its place in ``instances``
                # (where the handler looks): it gets the signal here
                _signal_group(proc, signals.received)

    # -- supervise ----------------------------------------------------------------------

    def _supervise(self, instances: list[_Instance], signals: forward_signals) -> None:
        """Wait until every instance ended; on the first failure, stop the others (unless
        poprun received a signal: ``signals`` then owns the stopping)."""
        stop_at: float | None = None      # when to SIGTERM the survivors
        kill_at: float | None = None      # when to SIGKILL them
        while any(i.state is InstanceState.RUNNING for i in instances):
            now = time.monotonic()
            for inst in instances:
                if inst.state is InstanceState.RUNNING and inst.proc.poll() is not None:
                    self._ended(inst, stopping=stop_at is not None
                                or signals.received is not None)
                    if inst.failure is not None and stop_at is None \
                            and signals.received is None:
                        stop_at = now + self.stop_wait_s
                        logger.info("%s; stopping the other instances",
                                    inst.failure.describe())
                        if self.on_failure is not None:
                            self.on_failure(inst.failure)
            if stop_at is not None and kill_at is None and now >= stop_at:
                self._signal_all(instances, signal.SIGTERM)
                kill_at = now + GRACE_PERIOD_S
            if kill_at is not None and now >= kill_at:
                self._signal_all(instances, signal.SIGKILL)
                kill_at = float("inf")
            time.sleep(POLL_INTERVAL_S)

    def _ended(self, inst: _Instance, stopping: bool) -> None:
        code = inst.proc.returncode
        if code == 0:
            inst.state = InstanceState.SUCCEEDED
            return
        observed = time.time()
        recorded = read_error_file(inst.error_file)
        if recorded is not None:
            inst.failure = recorded
        elif code < 0:
            # Killed: by poprun while stopping the job (no time: never the root cause),
            # or from outside (the time poprun saw it).
            inst.failure = InstanceFailure(inst.index, signal=-code,
                                           time=None if stopping else observed)
        else:
            inst.failure = InstanceFailure(inst.index, exit_code=code, time=observed)
        inst.state = InstanceState.STOPPED if stopping and code < 0 else InstanceState.FAILED

    @staticmethod
    def _signal_all(instances: Sequence[_Instance], signum: int) -> None:
        """``signum`` to every running instance's process group (its own session: what the
        program started goes too)."""
        for inst in instances:
            if inst.proc.poll() is None:
                _signal_group(inst.proc, signum)

    @staticmethod
    def _kill_all(instances: Sequence[_Instance]) -> None:
        """SIGKILL what is left of every instance's process group, and reap the instances."""
        for inst in instances:
            _signal_group(inst.proc, signal.SIGKILL)
            inst.proc.wait()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _discard(text: str) -> None:
    """Where the output of an instance hidden by ``--only-output-from-instance`` goes."""


def _pump(pipe, tagger: LineTagger) -> None:
    """Feed a child's pipe to its tagger, line by line, until the child closes it."""
    try:
        for data in iter(lambda: pipe.read1(65536), b""):
            tagger.feed(data)
    finally:
        tagger.close()
        pipe.close()
