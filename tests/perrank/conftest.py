"""The per-rank suite's IPU system: configured once per instance, shared by its modules."""

from __future__ import annotations

import pytest

from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist


@pytest.fixture(scope="session")
def strategy():
    cfg = IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
    return IPUMultiReplicaStrategy()
