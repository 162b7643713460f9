"""Running poprun jobs from tests: hard timeouts, and no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"


def run_poprun(args: list[str], timeout_s: float, cwd: Path | None = None,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """``poprun *args`` as a real process; killed (with its whole session) past ``timeout_s``.

    Raises:
        AssertionError: the job did not finish within ``timeout_s`` (output included).
    """
    proc = subprocess.Popen([sys.executable, "-m", "poprun", *args], cwd=cwd or REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"poprun {' '.join(args)} did not finish within {timeout_s} s\n"
                             f"stdout:\n{out}\nstderr:\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def processes_matching(marker: str) -> list[str]:
    """Command lines of live processes that contain ``marker`` (not this test process)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(f"{pid}: {cmdline}")
    return found


def wait_no_processes(marker: str, timeout_s: float = 5.0) -> list[str]:
    """Wait until no process contains ``marker``; returns those still alive after the wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_matching(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def describe(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
