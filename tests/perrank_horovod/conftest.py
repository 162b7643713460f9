"""Each rank leaves its result in ``$HVD_RESULTS_DIR/rank_<rank>.txt`` (passed and failed
counts): plain mpirun may interleave the ranks' stdout, files do not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_counts = {"passed": 0, "failed": 0}


@pytest.fixture(scope="session", autouse=True)
def horovod():
    """Horovod started once per instance (after its IPU system, under poprun/TF_CONFIG)."""
    import collectives.horovod as hvd
    if os.environ.get("POPDIST_NUM_TOTAL_REPLICAS") or os.environ.get("TF_CONFIG"):
        from ipu_node import IPUConfig
        from poprun import popdist
        cfg = IPUConfig()
        popdist.set_ipu_config(cfg)
        cfg.configure_ipu_system()
    hvd.init()
    yield
    hvd.shutdown()
_rank: list[int] = []


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome == "failed":
        _counts[report.outcome if report.outcome in _counts else "failed"] += 1
    import collectives.horovod as hvd
    if not _rank and hvd.is_initialized():  # (shut down by the time the session ends)
        _rank.append(hvd.rank())


def pytest_sessionfinish(session, exitstatus):
    directory = os.environ.get("HVD_RESULTS_DIR")
    if not directory:
        return
    rank = _rank[0] if _rank else f"unknown_{os.getpid()}"
    Path(directory, f"rank_{rank}.txt").write_text(
        f"{_counts['passed']} {_counts['failed']} {exitstatus}")
