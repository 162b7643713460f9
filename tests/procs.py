"""Helpers for tests that start processes: hard timeouts, and no child left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = Path(__file__).resolve().parent / "programs"
PYTHON = sys.executable


def child_env(**extra: str) -> dict[str, str]:
    """os.environ plus ``extra``, with the repository importable and short timeouts."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("IPUPOD_CONNECT_TIMEOUT_S", "30")
    env.setdefault("IPUPOD_COLLECTIVE_TIMEOUT_S", "60")
    env.update(extra)
    return env


def run(cmd: list[str], timeout_s: float, **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; past ``timeout_s`` kill the whole session and fail."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out, err = proc.communicate()
        raise AssertionError(f"{cmd} did not end within {timeout_s} s\nstdout:\n{out}\n"
                             f"stderr:\n{err}") from None
    finally:
        kill_session(proc)  # anything the command left behind in its session
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except FileNotFoundError:
        return False
    return True


def wait_gone(pids, timeout_s: float) -> list[int]:
    """Wait until none of ``pids`` runs; returns those still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    for pid in left:  # never leave them behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def run_poprun(args: list[str], timeout_s: float, env: dict | None = None,
               cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``poprun *args`` (this interpreter's) with ``env`` added to os.environ, killed with its
    whole session past ``timeout_s``.

    Raises:
        AssertionError: the job did not finish within ``timeout_s`` (output included).
    """
    return run([PYTHON, "-m", "poprun", *args], timeout_s, env={**os.environ, **(env or {})},
               cwd=cwd)


def poprun(args: list[str], timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess:
    """``poprun args`` with :func:`child_env` (repository importable, short timeouts)."""
    return run([PYTHON, "-m", "poprun", *args], timeout_s, env=child_env(**env), cwd=ROOT)


def processes_matching(marker: str) -> list[str]:
    """Command lines of live processes that contain ``marker`` (not this test process)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid() or not alive(int(pid)):
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
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
    """A job's exit code and output, for assertion messages."""
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def shm_entries() -> set[str]:
    """The names in /dev/shm now."""
    return set(os.listdir("/dev/shm"))


def left_in_shm(before: set[str]) -> set[str]:
    """/dev/shm names made since ``before`` that no live process maps: what a job left
    behind. (A segment of another job that still runs on this machine is mapped, so it does
    not count; the suite may share the machine with other ipupod jobs.)"""
    from launch.mpirun import mapped_shm_names
    new = shm_entries() - before
    return new - mapped_shm_names("") if new else new
