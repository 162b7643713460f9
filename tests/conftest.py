import os
import subprocess
import tempfile

import pytest

# IPU occupancy is machine-wide (lock files): the suite gets a directory of its own, so jobs a
# developer runs at the same time neither block the tests nor are blocked by them.
os.environ.setdefault("IPUPOD_OCCUPANCY_DIR", tempfile.mkdtemp(prefix="ipupod-tests-"))

# tests/perrank is run by every instance of a job (test_collectives_multiprocess.py starts it
# through poprun); a plain run of the suite does not collect it.
collect_ignore = []
if "POPDIST_NUM_TOTAL_REPLICAS" not in os.environ:
    collect_ignore.append("perrank")
# tests/perrank_horovod: every rank of a job runs it (test_horovod_multiprocess.py)
if "IPUPOD_HVD_PERRANK" not in os.environ:
    collect_ignore.append("perrank_horovod")


@pytest.fixture
def local_system():
    """A configured single-instance system; ``make(n)`` gives n local replicas."""
    import ipu_node
    from collectives.strategies import IPUMultiReplicaStrategy

    def make(num_replicas: int) -> IPUMultiReplicaStrategy:
        cfg = ipu_node.IPUConfig()
        cfg.auto_select_ipus = num_replicas
        cfg.configure_ipu_system()
        return IPUMultiReplicaStrategy()

    yield make
    ipu_node.reset_ipu_configuration()


@pytest.fixture
def one_ipu_system():
    """A configured system of one IPU (reset afterwards)."""
    import ipu_node

    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    yield
    ipu_node.reset_ipu_configuration()


# Tests by layer: a test that starts a process (poprun, mpirun, a child interpreter), runs a
# whole training job or waits out a timeout of seconds is marked ``slow``, so that
# ``pytest -m "not slow"`` runs the unit layer alone (under 30 s on 2 cores). An unmarked test
# that starts a process fails here, naming the command, instead of quietly joining the unit
# layer.
def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: starts processes (poprun, mpirun, a child interpreter), runs a "
                   "whole job or waits out timeouts; deselect with -m 'not slow' to run the unit layer alone")


class _UnmarkedProcessError(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _processes_only_when_marked(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    def refuse(self, args, *rest, **kw):
        raise _UnmarkedProcessError(
            f"{request.node.nodeid} starts a process ({args!r}) but is not marked "
            "'slow' (tests/conftest.py): mark it with @pytest.mark.slow")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)

    def refuse_fork():
        raise _UnmarkedProcessError(
            f"{request.node.nodeid} forks but is not marked 'slow' (tests/conftest.py)")

    monkeypatch.setattr(os, "fork", refuse_fork)
    yield
