"""Infeed distribution by global replica index across instances: 2 instances x 2 replicas
feed every global replica r the dataset element i*R + r, exactly as 1 instance x 4 replicas
does, and each instance's outfeed holds its own local replicas' values."""

from __future__ import annotations

import numpy as np
import pytest

from poprun.testing import run_job
from tests.programs import infeed_layout

pytestmark = pytest.mark.slow  # starts processes (tests/conftest.py)


def test_two_instances_feed_replicas_by_global_index():
    [one] = run_job(infeed_layout.layout, num_instances=1, num_replicas=4, timeout=120)
    parts = run_job(infeed_layout.layout, num_instances=2, num_replicas=4, timeout=120)

    order = np.array([float(v) for v in infeed_layout.dataset()])
    expected = np.array([[order[i * 4 + r] for r in range(4)] for i in range(5)])
    assert one["elements"].shape == (5, 4)
    np.testing.assert_array_equal(one["replicas"], np.tile(np.arange(4.0), (5, 1)))
    np.testing.assert_array_equal(one["elements"], expected)

    for i, part in enumerate(parts):  # each instance dequeues its own local replicas
        assert part["elements"].shape == (5, 2)
        np.testing.assert_array_equal(part["replicas"], np.tile([2.0 * i, 2.0 * i + 1], (5, 1)))
        np.testing.assert_array_equal(part["elements"], expected[:, 2 * i:2 * i + 2])
        assert part["sums"].tobytes() == one["sums"][:, 2 * i:2 * i + 2].tobytes()
