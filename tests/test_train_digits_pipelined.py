"""The second main job: the digits MLP as a two-stage pipeline (examples/train_digits_pipelined.py).

- the main job (``poprun -n 2 --num-replicas 4 --ipus-per-replica 2``, default settings)
  reaches test accuracy >= 0.95, prints the modelled step time and bubble fraction, and
  prints ``test_accuracy=<float>`` last;
- its checkpoint has the same bytes on both instances and as the same 4 replicas in one
  instance (``-n 1 --num-replicas 4``).
"""

import numpy as np
import pytest

from tests.procs import ROOT as REPO
from tests.procs import describe, run_poprun, wait_no_processes

EXAMPLE = str(REPO / "examples" / "train_digits_pipelined.py")


def _train(tmp_path, name, poprun_args, timeout_s=180):
    ckpt = tmp_path / name
    result = run_poprun([*poprun_args, "--ipus-per-replica", "2", "python", EXAMPLE,
                         "--checkpoint-dir", str(ckpt)], timeout_s)
    assert result.returncode == 0, describe(result)
    return result, [dict(np.load(p)) for p in sorted(ckpt.glob("instance_*.npz"))]


def _assert_identical(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("main"), "2x2", ["-n", "2", "--num-replicas", "4"])


def test_main_job_reaches_the_accuracy_and_reports_the_modelled_step(main_job):
    result, checkpoints = main_job
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("[1,0]<stdout>:test_accuracy="), describe(result)
    accuracy = float(lines[-1].split("=")[1])
    assert accuracy >= 0.95
    assert float(checkpoints[0]["test_accuracy"]) == pytest.approx(accuracy, abs=1e-4)
    modelled = [line for line in lines if "modelled step time:" in line]
    assert len(modelled) == 1 and "bubble fraction" in modelled[0], describe(result)
    assert "(Grouped, G=4, micro-batch 4)" in modelled[0]
    assert wait_no_processes(EXAMPLE) == []


def test_checkpoint_bytes_are_the_same_on_every_instance_and_layout(main_job, tmp_path):
    _, checkpoints = main_job
    assert len(checkpoints) == 2
    _assert_identical(checkpoints[0], checkpoints[1])
    _, single = _train(tmp_path, "1x4", ["-n", "1", "--num-replicas", "4"])
    assert len(single) == 1
    _assert_identical(checkpoints[0], single[0])
