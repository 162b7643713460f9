"""The example of the README: data-parallel training on the digits, its oracles.

- distributed training equals single-replica training on the same global batch (losses to 6
  decimals), and is bit-identical across layouts of the same replicas;
- every instance's checkpoint holds the same arrays, bit for bit;
- the main job (``poprun -n 4``, default settings) reaches test accuracy >= 0.95.
"""

import numpy as np
import pytest

from tests.procs import ROOT as REPO
from tests.procs import describe, run_poprun, wait_no_processes

pytestmark = pytest.mark.slow  # whole training jobs (tests/conftest.py)

EXAMPLE = str(REPO / "examples" / "train_digits.py")


def _train(tmp_path, name, poprun_args, *example_args, timeout_s=120):
    ckpt = tmp_path / name
    result = run_poprun([*poprun_args, "python", EXAMPLE, "--checkpoint-dir", str(ckpt),
                         *example_args], timeout_s)
    assert result.returncode == 0, describe(result)
    instances = sorted(ckpt.glob("instance_*.npz"))
    return result, [dict(np.load(p)) for p in instances]


def _assert_identical(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("short")
    epochs = ["--epochs", "4"]
    return {layout: _train(tmp, layout, args, *epochs)[1] for layout, args in {
        "2x2": ["-n", "2", "--num-replicas", "4"],
        "1x4": ["-n", "1", "--num-replicas", "4"],
        "1x1": ["-n", "1", "--num-replicas", "1"],
        "2x2 grpc": ["-n", "2", "--num-replicas", "4", "--launcher", "local",
                     "--transport", "grpc"],
    }.items()}


def test_layouts_of_the_same_replicas_give_identical_checkpoints(short_runs):
    assert len(short_runs["2x2"]) == 2 and len(short_runs["1x4"]) == 1
    _assert_identical(short_runs["2x2"][0], short_runs["1x4"][0])


def test_grpc_and_mpi_give_the_same_checkpoint_bytes(short_runs):
    """poprun's own launcher with the gRPC transport trains to exactly MPI's checkpoint."""
    assert len(short_runs["2x2 grpc"]) == 2
    for grpc_ckpt, mpi_ckpt in zip(short_runs["2x2 grpc"], short_runs["2x2"]):
        _assert_identical(grpc_ckpt, mpi_ckpt)


def test_every_instance_holds_the_same_checkpoint(short_runs):
    _assert_identical(short_runs["2x2"][0], short_runs["2x2"][1])


def test_distributed_equals_single_replica_on_the_same_global_batch(short_runs):
    distributed, single = short_runs["2x2"][0]["losses"], short_runs["1x1"][0]["losses"]
    assert len(distributed) == len(single) > 50
    np.testing.assert_almost_equal(distributed, single, decimal=6)


@pytest.mark.slow
def test_main_job_reaches_the_accuracy_on_four_instances(tmp_path):
    result, checkpoints = _train(tmp_path, "main", ["-n", "4"], timeout_s=180)
    assert len(checkpoints) == 4
    for other in checkpoints[1:]:
        _assert_identical(checkpoints[0], other)
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("[1,0]<stdout>:test_accuracy="), describe(result)
    accuracy = float(last.split("=")[1])
    assert accuracy >= 0.95
    assert float(checkpoints[0]["test_accuracy"]) == pytest.approx(accuracy, abs=1e-4)
    assert wait_no_processes(EXAMPLE) == []
