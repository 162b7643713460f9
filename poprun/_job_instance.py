"""One instance of a test job (:mod:`poprun.testing`): ``python -m poprun._job_instance JOBDIR``,
started by poprun's launcher like any instance (under :mod:`launch.bootstrap`).

It reads the job's description (``JOBDIR/spec.json``), then either calls a function found by
module and qualified name with the job's arguments (:func:`poprun.testing.run_job`), or runs
one test of a pytest session in this process, its fixtures resolved here (the ``poprun``
marker, :mod:`poprun.pytest_plugin`). Its outcome goes to ``JOBDIR/outcome.<i>.json``:
``passed``, ``failed`` (error, traceback, the replica whose function raised), ``skipped``
or ``timed out``; a failed instance then records its error for the launcher and exits 1,
so that the launcher stops the job.

A watchdog ends the instance at the job's deadline: it records ``timed out`` (unless the
instance had written its outcome and waits in its end), writes the stacks of every thread to
stderr (``faulthandler``) and leaves with :data:`TIMEOUT_EXIT_CODE`; should the interpreter
be stuck holding the GIL, faulthandler's own C watchdog dumps the stacks and exits
:data:`GIL_GRACE_S` later.
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import os
import re
import sys
import threading
import time
import traceback

from launch import env as envnames
from launch.errorfile import write_error_file
from poprun._job_files import decode_value, encode_value, outcome_path, read_json, spec_path, \
    write_json

__all__ = ["main", "replica_of", "TIMEOUT_EXIT_CODE", "GIL_GRACE_S"]

#: exit code of an instance stopped by the job's timeout (that of coreutils' ``timeout``)
TIMEOUT_EXIT_CODE = 124
#: seconds between the deadline and faulthandler's C-level fallback (the GIL never came back)
GIL_GRACE_S = 2.0

_NO_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"
_REPLICA_NOTE = re.compile(r"raised in the replica function of replica (\d+)")


def replica_of(exc: BaseException | None) -> int | None:
    """The global replica index whose replica function raised ``exc`` (the note the replica
    executor adds, :mod:`ipu_node.runtime.replica`), following causes; None if not one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for note in getattr(exc, "__notes__", ()) or ():
            match = _REPLICA_NOTE.search(str(note))
            if match:
                return int(match.group(1))
        exc = exc.__cause__ or exc.__context__
    return None


class _Watchdog:
    """Ends this instance at ``deadline`` (wall-clock seconds since the epoch)."""

    def __init__(self, jobdir: str, index: int, deadline: float, timeout_s: float):
        self.jobdir, self.index, self.timeout_s = jobdir, index, timeout_s
        self.done = threading.Lock()   # held by whoever writes the outcome first
        self.finished = False          # the instance wrote its own outcome
        remaining = max(0.0, deadline - time.time())
        faulthandler.dump_traceback_later(remaining + GIL_GRACE_S, exit=True,
                                          file=sys.__stderr__)
        self.timer = threading.Timer(remaining, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        if self.done.acquire(blocking=False):
            message = (f"instance {self.index} had not finished when the job's timeout of "
                       f"{self.timeout_s:g} s ran out")
            write_json(outcome_path(self.jobdir, self.index),
                       {"instance": self.index, "state": "timed out", "error": message})
            error_file = os.environ.get(envnames.ERROR_FILE)
            if error_file:   # the launcher learns it at once and stops the others
                write_error_file(error_file, self.index, TIMEOUT_EXIT_CODE, message)
        elif self.finished:   # its outcome is written, but the process has not ended
            message = (f"instance {self.index} finished its part but had not ended when the "
                       f"job's timeout of {self.timeout_s:g} s ran out")
        else:
            return   # the instance is writing its outcome
        stream = sys.__stderr__
        stream.write(f"ipupod: {message}; the stacks of its threads:\n")
        stream.flush()
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
        os._exit(TIMEOUT_EXIT_CODE)

    def finish(self, outcome: dict) -> bool:
        """Write ``outcome`` unless the deadline came first; whether it was written. The
        watchdog stays armed: an instance that then does not end (waiting for the others in
        the launcher's end of an MPI job) is stopped at the deadline all the same."""
        if not self.done.acquire(blocking=False):
            return False
        write_json(outcome_path(self.jobdir, self.index), outcome)
        self.finished = True
        return True


def _find(module_name: str, qualname: str, path: str):
    """The function ``qualname`` of module ``module_name`` (imported by name, or else from
    ``path`` under that name: a test module pytest imported from its file)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        if not path:
            raise
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    target = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _call(spec: dict, jobdir: str, index: int) -> dict:
    try:
        fn = _find(spec["module"], spec["qualname"], spec.get("path", ""))
        args = decode_value(spec["args"], jobdir)
        kwargs = decode_value(spec["kwargs"], jobdir)
        value = fn(*args, **kwargs)
        return {"state": "passed", "value": encode_value(value, jobdir, f"value.{index}",
                                                         f"the return value of instance {index}")}
    except Exception as exc:  # noqa: BLE001 - the outcome says what, the exit code that
        return {"state": "failed", "error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc)),
                "replica": replica_of(exc)}


class _Recorder:
    """A pytest plugin that keeps the outcome of the one test this instance runs."""

    def __init__(self, autoload: str | None = None):
        self.autoload = autoload   # the variable's value before the instance set it
        self.reports: list[dict] = []
        self.collect_errors: list[str] = []
        self.replica: int | None = None

    def pytest_configure(self, config) -> None:
        # read at start only: the test and its children see the variable as it was
        if self.autoload is None:
            os.environ.pop(_NO_AUTOLOAD, None)
        else:
            os.environ[_NO_AUTOLOAD] = self.autoload

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.collect_errors.append(report.longreprtext)

    def pytest_exception_interact(self, node, call, report) -> None:
        if call.excinfo is not None and self.replica is None:
            self.replica = replica_of(call.excinfo.value)

    def pytest_runtest_logreport(self, report) -> None:
        entry = {"when": report.when, "outcome": report.outcome}
        if report.failed:
            entry["text"] = report.longreprtext
        elif report.skipped and isinstance(report.longrepr, tuple):
            entry["text"] = str(report.longrepr[2])
        self.reports.append(entry)

    def outcome(self, exit_code: int) -> dict:
        failed = [r for r in self.reports if r["outcome"] == "failed"]
        if failed:
            first = failed[0]
            lines = [ln for ln in first["text"].splitlines() if ln.startswith("E ")]
            error = lines[0][1:].strip() if lines else first["text"].strip().splitlines()[-1]
            where = "" if first["when"] == "call" else f" (in the test's {first['when']})"
            return {"state": "failed", "error": error + where,
                    "traceback": "\n\n".join(r["text"] for r in failed),
                    "replica": self.replica}
        if any(r["outcome"] == "skipped" for r in self.reports):
            reason = next(r.get("text", "") for r in self.reports if r["outcome"] == "skipped")
            return {"state": "skipped", "error": reason}
        if not self.reports:
            why = "\n".join(self.collect_errors) or f"pytest exit code {exit_code}"
            return {"state": "failed", "error": "the test was not found or not collected "
                                                "in the instance", "traceback": why}
        return {"state": "passed"}


def _pytest(spec: dict, jobdir: str, index: int) -> dict:
    import pytest
    os.environ[envnames.PYTEST_JOB] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)
    # the parent names the plugins it loaded from installed distributions (-p): no scan of
    # every installed distribution for entry points (poprun.pytest_plugin._plugin_args)
    recorder = _Recorder(os.environ.get(_NO_AUTOLOAD))
    if not spec.get("autoload", False):
        os.environ[_NO_AUTOLOAD] = "1"
    basetemp = os.path.join(jobdir, f"tmp.{index}")   # tmp_path: removed with the job
    code = pytest.main([*spec["pytest_args"], "--basetemp", basetemp], plugins=[recorder])
    return recorder.outcome(int(code))


def main(argv: list[str] | None = None) -> int:
    """Run this instance's part of the job; 0 when it passed (or was skipped)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m poprun._job_instance JOBDIR")
    jobdir = argv[0]
    spec = read_json(spec_path(jobdir))
    if spec is None:
        raise SystemExit(f"poprun._job_instance: no job description in {jobdir}")
    index = int(os.environ.get(envnames.INSTANCE_INDEX, "0"))
    watchdog = _Watchdog(jobdir, index, float(spec["deadline"]), float(spec["timeout_s"]))
    for entry in spec.get("sys_path", ()):
        if entry not in sys.path:
            sys.path.append(entry)
    outcome = _call(spec, jobdir, index) if spec["kind"] == "call" else _pytest(spec, jobdir, index)
    outcome["instance"] = index
    if not watchdog.finish(outcome):
        time.sleep(GIL_GRACE_S + 60)   # the watchdog is ending this process
    if outcome["state"] != "failed":
        return 0
    error_file = os.environ.get(envnames.ERROR_FILE)
    if error_file:   # the launcher (and, through it, the others) learn the real error
        write_error_file(error_file, index, 1, outcome["error"], outcome.get("traceback", ""))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)   # as the bootstrap ends a failed instance: no MPI_Finalize to wait in


if __name__ == "__main__":
    sys.exit(main())
