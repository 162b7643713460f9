import pytest


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
