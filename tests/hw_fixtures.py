"""Fixtures shared by the tests of the hardware model (tests/test_hw_*.py)."""

from __future__ import annotations

import pytest

from ipu_node import env, reset_ipu_configuration


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A private occupancy directory, no job id, the default system; reset afterwards."""
    monkeypatch.setenv(env.IPUPOD_OCCUPANCY_DIR, str(tmp_path / "occupancy"))
    monkeypatch.delenv(env.IPUPOD_JOB_ID, raising=False)
    monkeypatch.delenv(env.IPUPOD_SYSTEM, raising=False)
    reset_ipu_configuration()
    yield tmp_path / "occupancy"
    reset_ipu_configuration()
