"""examples/train_digits_multiworker.py: the seeds' multi-worker custom loop. Oracle (anchors
§0.5a): two workers (TF_CONFIG over gRPC, and Horovod over mpirun) give the losses of one
worker training on the concatenated batches, to 6 decimals; one worker reaches test
accuracy >= 0.95.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.procs import PYTHON, ROOT, child_env, run

pytestmark = pytest.mark.slow  # whole training jobs (tests/conftest.py)

EXAMPLE = str(ROOT / "examples" / "train_digits_multiworker.py")
STEPS = ["--max-steps", "25"]


@pytest.fixture(scope="module")
def single_worker_losses(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "losses.npy"
    job = run([PYTHON, EXAMPLE, *STEPS, "--losses-out", str(out)], timeout_s=120,
              env=child_env(), cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr
    return np.load(out)


@pytest.mark.parametrize("launcher", [
    [PYTHON, "-m", "launch.multiworker", "-n", "2", EXAMPLE],
    [str(Path(PYTHON).parent / "mpirun"), "-n", "2", PYTHON, EXAMPLE, "--horovod"],
], ids=["multiworker-grpc", "horovod-mpirun"])
@pytest.mark.slow
def test_two_workers_equal_one_worker_on_concatenated_batches(launcher, single_worker_losses,
                                                              tmp_path):
    out = tmp_path / "losses.npy"
    job = run([*launcher, *STEPS, "--losses-out", str(out)], timeout_s=150,
              env=child_env(), cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr
    losses = np.load(out)
    assert losses.shape == single_worker_losses.shape == (25,)
    np.testing.assert_almost_equal(losses, single_worker_losses, decimal=6)
    assert "test_accuracy=" in job.stdout.strip().splitlines()[-1]


def test_one_worker_reaches_the_accuracy(monkeypatch):
    import importlib.util

    import ipu_node
    spec = importlib.util.spec_from_file_location("train_digits_multiworker", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("TF_CONFIG", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    try:
        assert module.main([]) >= 0.95
    finally:
        ipu_node.reset_ipu_configuration()
