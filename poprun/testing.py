"""Run a function, or a test, in every instance of an emulated job, as ``poprun`` runs a
program: multi-worker integration tests without hardware.

:func:`run_job` (as TF's ``multi_process_runner.run``) calls a function in every instance of
a job and returns each instance's return value, in instance order; the ``poprun`` pytest
marker (:mod:`poprun.pytest_plugin`) runs a whole test there. Both start the job the way the
``poprun`` command does, with its own code: the command line is poprun's
(:func:`poprun.options.parse_args`), the plan and its checks :func:`poprun.cli.prepare_job`,
the IPUs reserved and the instances started and supervised by
:func:`poprun.cli.run_reserved` (the ``mpirun`` backend with the MPI transport, or the
``local`` one with gRPC and a coordinator). Each instance sees the job as under poprun
(``POPDIST_*``, ``IPUPOD_*``; ``popdist``, the strategies and PopTorch read them), runs
``python -m poprun._job_instance`` under the launcher's bootstrap, and writes its outcome to a
private directory of the job.

Nothing is pickled: the function is found in each instance by module and qualified name (a
module-level function of an importable module or test file); arguments and return values
cross as JSON, with numpy arrays as ``.npy`` files written with ``allow_pickle=False``
(:mod:`poprun._job_files`).

Every job has a hard timeout (:data:`DEFAULT_TIMEOUT_S` unless given): at the deadline each
instance that has not finished records it, dumps the stacks of its threads (faulthandler) to
its stderr and exits; :data:`KILL_AFTER_S` later whatever is left of the job is killed. The
launcher's own teardown removes the job's lock files and shared memory, as for poprun.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable, Sequence

from poprun._job_files import decode_value, encode_value, outcome_path, read_json, \
    spec_path, write_json

__all__ = ["run_job", "start_job", "JobFailedError", "JobResult", "InstanceOutcome",
           "DEFAULT_TIMEOUT_S", "KILL_AFTER_S"]

#: seconds a job may run when no timeout is given (ipupod assumption: a multi-instance test
#: on 2 cores takes seconds; a minute catches a hang without cutting a slow CI runner short)
DEFAULT_TIMEOUT_S = 60.0
#: seconds after the deadline at which the parent kills what is left of the job (instances
#: end themselves at the deadline; this is for one that cannot)
KILL_AFTER_S = 5.0
#: lines of an instance's output shown in a failure message (the last ones)
OUTPUT_LINES = 60

_TAG = re.compile(r"^\[1,(\d+)\]<(stdout|stderr)>:(.*)$")


@dataclasses.dataclass(frozen=True)
class InstanceOutcome:
    """How one instance of a job ended.

    Attributes:
        instance: instance index.
        state: ``"passed"``, ``"failed"``, ``"skipped"`` (the test skipped itself),
            ``"timed out"`` (had not finished at the deadline) or ``"stopped"`` (ended by
            the launcher after another instance failed, before it finished).
        error: one line: the exception, or why the instance stopped; "" when it passed.
        traceback: the failure's traceback (the test's report under the marker); "" if none.
        replica: the global replica index whose replica function raised, or None.
        stdout, stderr: what the instance printed (untagged).
        value: the function's return value (:func:`run_job`), None otherwise.
    """

    instance: int
    state: str
    error: str = ""
    traceback: str = ""
    replica: int | None = None
    stdout: str = ""
    stderr: str = ""
    value: Any = None

    def describe(self) -> str:
        """``instance 1: failed in replica 3: ValueError: boom`` (one line)."""
        where = f" in replica {self.replica}" if self.replica is not None else ""
        what = {"passed": "finished", "stopped": "stopped before it finished"}.get(
            self.state, self.state)
        return f"instance {self.instance}: {what}{where}" + (f": {self.error}" if self.error
                                                              else "")


@dataclasses.dataclass(frozen=True)
class JobResult:
    """A finished job: every instance's outcome, in instance order, and the launcher's word.

    Attributes:
        outcomes: one per instance.
        timed_out: the job's deadline passed before every instance finished.
        timeout_s: the job's timeout, seconds.
        launcher_error: the launcher's one line on the failure ("" when none), e.g.
            ``instance 1 failed (exit code 1)``.
        launcher_output: what the launcher itself printed (mpirun's messages), untagged.
        shape: ``"2 instances, 4 replicas, transport mpi"``.
    """

    outcomes: tuple[InstanceOutcome, ...]
    timed_out: bool
    timeout_s: float
    launcher_error: str
    launcher_output: str
    shape: str

    @property
    def failed(self) -> list[int]:
        """Instances that failed or timed out, not counting those that failed only because
        another did (a lost peer, an aborted job: :data:`launch.supervise.CONSEQUENCES`)
        while another failed for a reason of its own."""
        from launch.supervise import CONSEQUENCES
        bad = [o for o in self.outcomes if o.state in ("failed", "timed out")]
        causes = [o for o in bad if not o.error.startswith(CONSEQUENCES)]
        return [o.instance for o in (causes or bad)]

    @property
    def passed(self) -> bool:
        return all(o.state in ("passed", "skipped") for o in self.outcomes)

    def summary(self) -> str:
        """The first line of a failure: what failed, then one line per instance."""
        if self.timed_out:
            late = [o.instance for o in self.outcomes if o.state in ("timed out", "stopped")]
            head = (f"job ({self.shape}) timed out after {self.timeout_s:g} s: "
                    f"instance{'s' if len(late) != 1 else ''} "
                    f"{', '.join(map(str, late))} had not finished (stopped; stacks below)")
        elif self.failed:
            named = [f"{o.instance}" + (f" (replica {o.replica})" if o.replica is not None
                                        else "")
                     for o in self.outcomes if o.instance in self.failed]
            head = (f"job ({self.shape}) failed: instance"
                    f"{'s' if len(named) != 1 else ''} {', '.join(named)}")
        else:
            head = f"job ({self.shape}) failed: {self.launcher_error or 'see the output'}"
        return "\n".join([head, *(f"  {o.describe()}" for o in self.outcomes)])

    def report(self, with_output: bool = True) -> str:
        """The whole failure message: :meth:`summary`, then each failed or late instance's
        traceback and (``with_output``) the end of its output."""
        parts = [self.summary()]
        if self.launcher_error and not self.failed:   # no instance said why: the launcher
            parts.append(f"launcher: {self.launcher_error}")
        failed = self.failed
        for o in sorted(self.outcomes, key=lambda o: o.instance not in failed):
            if o.state in ("passed", "skipped"):
                continue
            if o.traceback and o.instance in failed:
                parts.append(f"--- instance {o.instance}: traceback ---\n{o.traceback.rstrip()}")
            for name, text in (("stdout", o.stdout), ("stderr", o.stderr)) * with_output:
                lines = text.splitlines()
                if lines:
                    cut = f" (last {OUTPUT_LINES} lines)" if len(lines) > OUTPUT_LINES else ""
                    parts.append(f"--- instance {o.instance}: {name}{cut} ---\n"
                                 + "\n".join(lines[-OUTPUT_LINES:]))
        if self.launcher_output.strip():
            parts.append(f"--- launcher ---\n{self.launcher_output.rstrip()}")
        return "\n".join(parts)


class JobFailedError(RuntimeError):
    """An instance of the job failed or the job timed out; the message names the failed
    instances (and replica), with their tracebacks and output, and the others' state.

    Attributes:
        result: the :class:`JobResult`.
    """

    def __init__(self, result: JobResult):
        super().__init__(result.report())
        self.result = result


class _Collector:
    """A text stream the launcher writes tagged lines to; split per instance afterwards."""

    def __init__(self):
        self._parts: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        with self._lock:
            return "".join(self._parts)


def _split_output(text: str, num_instances: int) -> tuple[list[dict[str, list[str]]], str]:
    per = [{"stdout": [], "stderr": []} for _ in range(num_instances)]
    untagged = []
    for line in text.splitlines():
        match = _TAG.match(line)
        if match and int(match.group(1)) < num_instances:
            per[int(match.group(1))][match.group(2)].append(match.group(3))
        else:
            untagged.append(line)
    return per, "\n".join(untagged)


def _count(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_shape(num_instances, num_replicas, ipus_per_replica, transport, system,
                 timeout) -> float:
    _count("num_instances", num_instances)
    _count("num_replicas", num_replicas, allow_none=True)
    _count("ipus_per_replica", ipus_per_replica)
    if transport not in (None, "mpi", "grpc"):
        raise ValueError(f"transport must be 'mpi' or 'grpc' (or None: as poprun chooses), "
                         f"got {transport!r}")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"system must be a system name such as 'POD16', got {system!r}")
    timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def _poprun_argv(num_instances, num_replicas, ipus_per_replica, transport, system,
                 jobdir) -> list[str]:
    argv = ["--num-instances", str(num_instances), "--ipus-per-replica", str(ipus_per_replica)]
    if num_replicas is not None:
        argv += ["--num-replicas", str(num_replicas)]
    if transport is not None:
        argv += ["--transport", transport]
    if system is not None:
        argv += ["--system", system]
    return [*argv, sys.executable, "-m", "poprun._job_instance", jobdir]


class _Backstop:
    """Kills the processes this one started during the job, if any is left past ``at``
    (monotonic seconds)."""

    def __init__(self, at: float):
        from launch.supervise import descendants
        self._descendants = descendants
        self._before = set(descendants(os.getpid()))
        self.fired = False
        self._timer = threading.Timer(max(0.0, at - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        for pid in self._descendants(os.getpid()):
            if pid not in self._before:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def cancel(self) -> None:
        self._timer.cancel()


def start_job(kind: str, spec: dict, *, num_instances: int = 2, num_replicas: int | None = None,
              ipus_per_replica: int = 1, transport: str | None = None,
              system: str | None = None, timeout: float | None = None,
              write_files: Callable[[str], dict] | None = None) -> JobResult:
    """Run one job of ``python -m poprun._job_instance`` and gather every instance's outcome
    (the common part of :func:`run_job` and the ``poprun`` marker).

    Args:
        kind: ``"call"`` or ``"pytest"`` (what :mod:`poprun._job_instance` does).
        spec: the rest of the job's description (JSON).
        write_files: ``write_files(jobdir) -> dict``: writes what the instances read (the
            arguments' arrays) into the job's directory; its result joins ``spec``.
        num_instances, num_replicas, ipus_per_replica, transport, system: as ``poprun``'s
            ``--num-instances``, ``--num-replicas`` (default: one per instance),
            ``--ipus-per-replica``, ``--transport`` (``"mpi"``: mpirun; ``"grpc"``: poprun's
            own launcher; None: as poprun chooses) and ``--system``.
        timeout: the job's hard timeout, seconds (default :data:`DEFAULT_TIMEOUT_S`).

    Returns:
        The :class:`JobResult`, whether or not the job passed.

    Raises:
        ValueError: a bad argument, or a job poprun refuses (one line, from poprun).
        IPUError: the job's IPUs are busy (as poprun: nothing started).
        LaunchError: the job could not be started.
        KeyboardInterrupt: this process received SIGINT or SIGTERM (the job was stopped).
    """
    from launch.errors import InstanceFailedError, JobInterruptedError
    from launch.supervise import make_workdir
    from poprun import cli
    from poprun.options import UsageError, build_parser, parse_args

    timeout_s = _check_shape(num_instances, num_replicas, ipus_per_replica, transport, system,
                             timeout)
    jobdir = make_workdir()
    try:
        argv = _poprun_argv(num_instances, num_replicas, ipus_per_replica, transport, system,
                            jobdir)
        try:
            args, program = parse_args(build_parser(), argv)
        except (UsageError, SystemExit) as exc:
            raise ValueError(f"poprun refuses the job: {exc}") from None
        plan, model, _ = cli.prepare_job(args, program)
        plan = dataclasses.replace(plan, job_env=(*plan.job_env,
                                                  ("PYTHONPATH", _instance_pythonpath())))
        record = {**spec, "kind": kind, "timeout_s": timeout_s,
                  "sys_path": [p for p in sys.path if p and os.path.isdir(p)]}
        if write_files is not None:
            record.update(write_files(jobdir))
        started = time.monotonic()
        record["deadline"] = time.time() + timeout_s
        write_json(spec_path(jobdir), record)
        out, err = _Collector(), _Collector()
        backstop = _Backstop(started + timeout_s + KILL_AFTER_S)
        launcher_error, cause = "", None
        try:
            cli.run_reserved(plan, model, stdout=out, stderr=err)
        except InstanceFailedError as exc:
            launcher_error, cause = str(exc), exc.root_cause
        except JobInterruptedError as exc:
            raise KeyboardInterrupt(str(exc)) from None
        finally:
            backstop.cancel()
        late = backstop.fired or time.monotonic() - started >= timeout_s
        return _gather(jobdir, plan.num_instances, out.text() + err.text(), launcher_error,
                       cause, timeout_s, late,
                       f"{plan.num_instances} instance{'s' if plan.num_instances > 1 else ''}"
                       f", {plan.num_replicas} replicas, transport {plan.transport}")
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)


def _instance_pythonpath() -> str:
    """``PYTHONPATH`` of the instances: the directory this ipupod is imported from first
    (the instances run the same code as the test, whatever the install), then the test's."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])


def _gather(jobdir: str, num_instances: int, output: str, launcher_error: str,
            cause, timeout_s: float, late: bool, shape: str) -> JobResult:
    """Every instance's outcome: its own record, else the launcher's root cause (``cause``,
    a :class:`launch.errors.InstanceFailure`: an instance that died without a word, by
    ``os._exit`` or a signal), else stopped (timed out when the deadline had passed)."""
    per, untagged = _split_output(output, num_instances)
    outcomes = []
    for i in range(num_instances):
        record = read_json(outcome_path(jobdir, i)) or {}
        state = record.get("state") or ("timed out" if late else "stopped")
        error = record.get("error", "")
        if not record and cause is not None and cause.instance == i and not late:
            state = "failed"
            error = cause.error or cause.describe().removeprefix(
                f"instance {i} failed (").rstrip(")")   # "exit code 3", "killed by SIGSEGV"
        elif not record and not late:
            error = "ended by the launcher before it finished"
        outcomes.append(InstanceOutcome(
            instance=i, state=state, error=error, traceback=record.get("traceback", ""),
            replica=record.get("replica"), stdout="\n".join(per[i]["stdout"]),
            stderr="\n".join(per[i]["stderr"]),
            value=decode_value(record["value"], jobdir) if "value" in record else None))
    timed_out = late or any(o.state == "timed out" for o in outcomes)
    if not launcher_error and not all(o.state in ("passed", "skipped") for o in outcomes):
        launcher_error = "the job ended without every instance's outcome"
    return JobResult(tuple(outcomes), timed_out, timeout_s, launcher_error, untagged, shape)


def _locate(fn: Callable) -> tuple[str, str, str]:
    """(module, qualified name, file) by which an instance finds ``fn``.

    Raises:
        TypeError: ``fn`` is not a module-level function (a lambda, a closure, a method
            of an instance), or its module is ``__main__`` (an instance cannot import it).
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not callable(fn) or not module or not qualname or "<" in qualname:
        raise TypeError(f"run_job needs a function defined at the top level of a module (found "
                        f"by module and name in every instance, never pickled); got {fn!r}")
    if module == "__main__":
        raise TypeError(f"run_job: {qualname} is defined in __main__, which the instances "
                        "cannot import; move it into a module")
    try:
        path = inspect.getsourcefile(fn) or ""
    except TypeError:
        path = ""
    return module, qualname, path


def run_job(fn: Callable, *args: Any, num_instances: int = 2, num_replicas: int | None = None,
            ipus_per_replica: int = 1, transport: str | None = None, system: str | None = None,
            timeout: float | None = None, **kwargs: Any) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` in every instance of an emulated job; each instance's
    return value, in instance order (as TF's ``multi_process_runner.run``).

    ``fn`` runs in each instance as in a program started by ``poprun``: ``popdist`` gives the
    instance's index and replicas, ``IPUConfig`` + ``popdist.set_ipu_config`` its IPUs, the
    strategies and collectives the job's transport. It is found there by module and
    qualified name (define it at the top level of a module or test file; nothing is
    pickled). ``args``, ``kwargs`` and the return values cross as JSON values (dict with str
    keys, list, tuple, str, int, float, bool, None) and numpy arrays (``.npy``, saved and
    loaded with ``allow_pickle=False``; a numpy scalar comes back as one).

    Args:
        fn: a module-level function.
        num_instances: instances (``poprun --num-instances``), default 2.
        num_replicas: replicas of the whole job, a multiple of ``num_instances``
            (``--num-replicas``; default: one per instance).
        ipus_per_replica: ``--ipus-per-replica`` (default 1).
        transport: ``"mpi"`` (started by MPICH's mpirun) or ``"grpc"`` (started by poprun's
            own launcher, with a coordinator); None: as poprun chooses (mpi where the MPICH
            mpirun is installed).
        system: the emulated POD (``"POD16"``); None: as poprun chooses.
        timeout: the job's hard timeout, seconds (default :data:`DEFAULT_TIMEOUT_S`).

    Returns:
        ``[value of instance 0, value of instance 1, ...]``.

    Raises:
        JobFailedError: an instance raised (named, with its traceback and output, and the
            replica where the exception came from a replica function), or the job timed out
            (naming the instances that had not finished; every instance was stopped and
            its stacks dumped).
        TypeError: ``fn`` cannot be found in an instance, or an argument cannot cross
            (:class:`poprun._job_files.ValueFormatError`).
        ValueError, IPUError, LaunchError: as :func:`start_job` (nothing ran).
    """
    module, qualname, path = _locate(fn)

    def write_files(jobdir: str) -> dict:
        return {"args": encode_value(list(args), jobdir, "args", "args"),
                "kwargs": encode_value(kwargs, jobdir, "kwargs", "kwargs")}

    result = start_job("call", {"module": module, "qualname": qualname, "path": path},
                       num_instances=num_instances, num_replicas=num_replicas,
                       ipus_per_replica=ipus_per_replica, transport=transport, system=system,
                       timeout=timeout, write_files=write_files)
    if not result.passed:
        raise JobFailedError(result)
    return [o.value for o in result.outcomes]


def pytest_args(nodeid: str, rootdir: str, inifile: str | None, import_mode: str,
                plugin_args: Sequence[str]) -> list[str]:
    """The command line of the pytest session an instance runs for the test ``nodeid``: the
    parent's root, ini file, import mode and ``-p`` plugins, no cache (``--lf`` stays the
    parent's), no ``addopts``, output not captured (it is the instance's, tagged by the
    launcher; pytest's own report is the parent's). The instance adds its own
    ``--basetemp`` in the job's directory."""
    args = [os.path.join(rootdir, nodeid), "--rootdir", rootdir, "-p", "no:cacheprovider",
            "-p", "poprun.pytest_plugin", "-p", "no:terminal", "-o", "addopts=",
            "--capture=no", f"--import-mode={import_mode}", *plugin_args]
    if inifile:
        args += ["-c", inifile]
    return args
