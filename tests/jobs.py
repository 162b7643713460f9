"""Start a job of real processes with a hard timeout; leave no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def poprun(args: list[str], timeout_s: float, env: dict | None = None,
           cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``poprun *args`` (this interpreter's), killed with its whole process group after
    ``timeout_s``. Returns the completed process (stdout and stderr as text).

    Raises:
        AssertionError: the job did not finish in time (with its output so far).
    """
    full_env = {**os.environ, **(env or {})}
    command = [str(BIN / "poprun"), *args]
    proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(command)} did not finish in {timeout_s} s\n"
                             f"stdout:\n{out}\nstderr:\n{err}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the job left behind
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def python() -> str:
    return sys.executable
