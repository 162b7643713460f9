import os
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
