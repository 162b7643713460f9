"""Infeed distribution by global replica index across instances: 2 instances x 2 replicas
feed every global replica r the dataset element i*R + r, exactly as 1 instance x 4 replicas
does, and each instance's outfeed holds its own local replicas' values."""

from __future__ import annotations

import numpy as np
import pytest

from tests.procs import PYTHON, describe, poprun
from tests.programs import infeed_layout

pytestmark = pytest.mark.slow  # starts processes (tests/conftest.py)


def test_two_instances_feed_replicas_by_global_index(tmp_path):
    single = tmp_path / "1x4"
    for instances, out in (("1", single), ("2", tmp_path / "2x2")):
        job = poprun(["-n", instances, "--num-replicas", "4", PYTHON, "-m",
                      "tests.programs.infeed_layout", str(out)], timeout_s=120)
        assert job.returncode == 0, describe(job)

    order = np.array([float(v) for v in infeed_layout.dataset()])
    expected = np.array([[order[i * 4 + r] for r in range(4)] for i in range(5)])
    one = np.load(single / "instance0.npz")
    assert one["elements"].shape == (5, 4)
    np.testing.assert_array_equal(one["replicas"], np.tile(np.arange(4.0), (5, 1)))
    np.testing.assert_array_equal(one["elements"], expected)

    parts = [np.load(tmp_path / "2x2" / f"instance{i}.npz") for i in range(2)]
    for i, part in enumerate(parts):  # each instance dequeues its own local replicas
        assert part["elements"].shape == (5, 2)
        np.testing.assert_array_equal(part["replicas"], np.tile([2.0 * i, 2.0 * i + 1], (5, 1)))
        np.testing.assert_array_equal(part["elements"], expected[:, 2 * i:2 * i + 2])
        assert part["sums"].tobytes() == one["sums"][:, 2 * i:2 * i + 2].tobytes()
