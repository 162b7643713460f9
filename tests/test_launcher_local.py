"""poprun --launcher local: output tagging, supervision, root cause, signals, orphans, and an
instance SIGKILLed in the middle of a collective."""

import os
import signal
import subprocess
import sys
import time

import pytest

from launch.errors import LaunchError
from poprun.cli import choose_backend
from tests.procs import PROGRAMS, PYTHON, ROOT, alive, child_env, kill_session, poprun, wait_gone

ECHO = str(PROGRAMS / "echo_fail.py")
KILL = str(PROGRAMS / "kill_mid_collective.py")
LOCAL = ["--launcher", "local", "--transport", "grpc"]


def _no_mpirun():
    raise LaunchError("mpirun was not found")


@pytest.mark.parametrize("launcher, transport, expect", [
    (None, None, ("mpirun", "mpi")),
    ("local", None, ("local", "grpc")),
    (None, "grpc", ("local", "grpc")),
    ("mpirun", None, ("mpirun", "mpi")),
    (None, "mpi", ("mpirun", "mpi")),
    ("mpirun", "grpc", ("mpirun", "grpc")),
])
def test_choose_backend(launcher, transport, expect):
    assert choose_backend(launcher, transport, find=lambda: "/x/mpirun")[:2] == expect


def test_default_without_mpirun_is_local_grpc():
    launcher, transport, why = choose_backend(None, None, find=_no_mpirun)
    assert (launcher, transport) == ("local", "grpc") and "no MPICH mpirun" in why


def test_local_with_mpi_is_refused():
    with pytest.raises(ValueError, match="needs --launcher mpirun"):
        choose_backend("local", "mpi")


@pytest.mark.slow
def test_verbose_says_which_and_why():
    result = poprun(["-v", *LOCAL, "-n", "2", "python", ECHO], timeout_s=30)
    assert result.returncode == 0, result.stderr
    assert "launcher local, transport grpc: both given" in result.stderr


@pytest.mark.slow
def test_output_is_tagged_per_line():
    result = poprun([*LOCAL, "-n", "3", "python", ECHO], timeout_s=30)
    assert result.returncode == 0, result.stderr
    for i in range(3):
        assert f"[1,{i}]<stdout>:hello from {i}\n" in result.stdout
        assert f"[1,{i}]<stderr>:warning from {i}\n" in result.stderr


@pytest.mark.slow
def test_failure_stops_the_others_and_names_the_root_cause(tmp_path):
    start = time.monotonic()
    result = poprun([*LOCAL, "-n", "3", "python", ECHO], timeout_s=30,
                    FAIL_INSTANCE="1", SLEEP_S="60", PID_DIR=str(tmp_path))
    took = time.monotonic() - start
    assert result.returncode == 1, result.stderr
    assert "poprun: instance 1 failed (exit code 1): ValueError: boom in 1" in result.stderr
    assert took < 15, f"poprun took {took:.1f} s"
    pids = [int((tmp_path / str(i)).read_text()) for i in range(3)]
    assert wait_gone(pids, 2) == []


@pytest.mark.slow
def test_sigkill_mid_collective(tmp_path):
    """Figures: survivors raise PeerLostError naming instance 1 within 10 s; poprun exits
    non-zero within 15 s of the kill; no process is left."""
    kill_file = tmp_path / "kill-time"
    start = time.monotonic()
    result = poprun([*LOCAL, "-n", "3", "python", KILL], timeout_s=60,
                    KILL_INSTANCE="1", KILL_TIME_FILE=str(kill_file))
    end = time.time()
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert "poprun: instance 1 failed (killed by SIGKILL)" in result.stderr
    killed = float(kill_file.read_text())
    assert end - killed < 15, f"poprun ended {end - killed:.1f} s after the kill"
    lost = [line.split(" ", 3) for line in result.stdout.splitlines() if "LOST" in line]
    assert sorted(int(fields[1]) for fields in lost) == [0, 2], result.stdout + result.stderr
    for fields in lost:
        assert float(fields[2]) < 10, fields
        assert "instance 1" in fields[3], fields
    pids = [int(line.split()[-1]) for line in result.stdout.splitlines() if "PID" in line]
    assert len(pids) == 3 and wait_gone(pids, 2) == []
    assert time.monotonic() - start < 60


def _start_poprun(tmp_path, *args):
    return subprocess.Popen([PYTHON, "-m", "poprun", *LOCAL, "-n", "2", "python", ECHO, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env=child_env(SLEEP_S="60", PID_DIR=str(tmp_path)),
                            start_new_session=True)


def _pids(tmp_path, n=2, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = [tmp_path / str(i) for i in range(n)]
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError("the instances did not start")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_is_forwarded_and_everything_ends(tmp_path, signum):
    proc = _start_poprun(tmp_path)
    try:
        pids = _pids(tmp_path)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode != 0
        assert wait_gone(pids, 2) == []
    finally:
        kill_session(proc)


@pytest.mark.slow
def test_no_orphans_when_poprun_is_killed(tmp_path):
    proc = _start_poprun(tmp_path)
    try:
        pids = _pids(tmp_path)
        os.kill(proc.pid, signal.SIGKILL)      # poprun itself, not its children
        proc.wait(timeout=10)
        assert wait_gone(pids, 5) == [], "instances outlived a killed poprun"
    finally:
        kill_session(proc)
