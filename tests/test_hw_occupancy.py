"""IPU occupancy shared between processes (ipu_node.occupancy), with real child processes."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

from ipu_node import IPUConfig, env, reset_ipu_configuration
from ipu_node.errors import IPUBusyError
from ipu_node.runtime.occupancy import Occupancy
from tests.hw_fixtures import isolated  # noqa: F401  (pytest fixture)

TIMEOUT_S = 20

CHILD = """
import sys, time
from ipu_node import IPUConfig
cfg = IPUConfig()
cfg.select_ipus = int(sys.argv[1])
system = cfg.configure_ipu_system()
print("ATTACHED", [i.id for i in system.devices[0].ipus], flush=True)
time.sleep(60)
"""


INSTANCE = """
import sys, time
from ipu_node import IPUConfig
cfg = IPUConfig()
cfg.auto_select_ipus = 4
mrd = cfg.experimental.multi_replica_distribution
mrd.process_count, mrd.process_index, mrd.transport = 4, int(sys.argv[1]), "mpi"
system = cfg.configure_ipu_system()
print("ATTACHED", [i.id for i in system.devices[0].ipus], flush=True)
time.sleep(60)
"""


def _start_child(device_id: int, job_id: str | None = None,
                 script: str = CHILD) -> subprocess.Popen:
    child_env = dict(os.environ)
    child_env.pop(env.IPUPOD_JOB_ID, None)
    if job_id:
        child_env[env.IPUPOD_JOB_ID] = job_id
    return subprocess.Popen([sys.executable, "-c", script, str(device_id)], env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_attached(proc: subprocess.Popen) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("ATTACHED"):
        proc.kill()
        _, err = proc.communicate(timeout=TIMEOUT_S)
        pytest.fail(f"child did not attach (rc={proc.returncode}): {line!r} {err}")
    return line


@pytest.fixture
def children():
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=TIMEOUT_S)


@pytest.mark.slow
def test_busy_device_names_the_holder_and_sigkill_frees_it(isolated, children):
    child = _start_child(24)                           # POD16 device 24 = IPUs 0..3
    children.append(child)
    assert "[0, 1, 2, 3]" in _wait_attached(child)
    cfg = IPUConfig()
    cfg.select_ipus = 16                               # IPUs 0, 1: inside device 24
    with pytest.raises(IPUBusyError, match=rf"IPU 0 is attached by pid {child.pid} \("):
        cfg.configure_ipu_system()
    auto = IPUConfig()
    auto.auto_select_ipus = 4                          # takes the next free device
    assert [i.id for i in auto.configure_ipu_system().devices[0].ipus] == [4, 5, 6, 7]
    holders = Occupancy("POD16").holders()
    assert {h.ipu_id: h.pid for h in holders} == {
        **{i: child.pid for i in range(4)}, **{i: os.getpid() for i in range(4, 8)}}
    reset_ipu_configuration()
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=TIMEOUT_S)
    assert [i.id for i in cfg.configure_ipu_system().devices[0].ipus] == [0, 1]
    assert {h.ipu_id for h in Occupancy("POD16").holders()} == {0, 1}


def test_reset_frees_and_a_process_cannot_attach_twice(isolated):
    cfg = IPUConfig()
    cfg.select_ipus = 30                               # all 16 IPUs
    cfg.configure_ipu_system()
    lease = None
    with pytest.raises(IPUBusyError, match="IPU 0 is attached by pid"):
        lease = Occupancy("POD16").acquire([0])
    reset_ipu_configuration()
    lease = Occupancy("POD16").acquire(range(16))
    lease.release()
    assert Occupancy("POD16").holders() == []


def test_no_free_device_left(isolated):
    first = Occupancy("POD16").acquire(range(14))
    try:
        cfg = IPUConfig()
        cfg.auto_select_ipus = 4
        with pytest.raises(IPUBusyError, match="no free device of 4 IPUs on POD16"):
            cfg.configure_ipu_system()
        cfg.auto_select_ipus = 2
        assert [i.id for i in cfg.configure_ipu_system().devices[0].ipus] == [14, 15]
    finally:
        first.release()


@pytest.mark.slow
def test_a_job_has_a_partition_of_its_own(isolated, children, monkeypatch):
    child = _start_child(30, job_id="job-A")           # the whole POD16, in job A's partition
    children.append(child)
    _wait_attached(child)
    cfg = IPUConfig()
    cfg.auto_select_ipus = 16                          # machine scope: unaffected by job A
    cfg.configure_ipu_system()
    reset_ipu_configuration()
    monkeypatch.setenv(env.IPUPOD_JOB_ID, "job-A")
    with pytest.raises(IPUBusyError, match="partition job-job-A"):
        cfg.configure_ipu_system()
    scopes = {h.scope for h in Occupancy("POD16").holders()}
    assert scopes == {"job-job-A"}


@pytest.mark.slow
def test_instances_of_one_launcher_share_a_partition(isolated, children):
    cfg = IPUConfig()
    cfg.select_ipus = 30                               # this process holds the whole machine
    cfg.configure_ipu_system()
    for index in range(4):                             # a 4-instance job, no IPUPOD_JOB_ID
        children.append(_start_child(index, script=INSTANCE))
    lines = [_wait_attached(child) for child in children]
    assert [line.split(" ", 1)[1].strip() for line in lines] == [
        "[0, 1, 2, 3]", "[4, 5, 6, 7]", "[8, 9, 10, 11]", "[12, 13, 14, 15]"]
    scopes = {h.scope for h in Occupancy("POD16").holders()}
    assert scopes == {"machine", f"launcher-{os.getpid()}"}
