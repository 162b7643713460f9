"""The second main job: the digits MLP as a two-stage pipeline (examples/train_digits_pipelined.py).

- the main job (``poprun -n 2 --num-replicas 4 --ipus-per-replica 2``, default settings)
  reaches test accuracy >= 0.95, prints the modelled step time and bubble fraction, and
  prints ``test_accuracy=<float>`` last;
- its checkpoint has the same bytes on both instances and as the same 4 replicas in one
  instance (``-n 1 --num-replicas 4``), whose report (``--report-dir``) carries the run's
  own card and the pipeline's IPU tracks.
"""

import numpy as np
import pytest

from tests.procs import ROOT as REPO
from tests.procs import describe, run_poprun, wait_no_processes

pytestmark = pytest.mark.slow  # whole training jobs (tests/conftest.py)

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


@pytest.mark.slow
def test_checkpoint_bytes_are_the_same_on_every_instance_and_layout(main_job, tmp_path):
    _, checkpoints = main_job
    assert len(checkpoints) == 2
    _assert_identical(checkpoints[0], checkpoints[1])
    result, single = _train(tmp_path, "1x4", ["-n", "1", "--num-replicas", "4",
                                              "--report-dir", str(tmp_path / "reports")])
    assert len(single) == 1
    _assert_identical(checkpoints[0], single[0])
    _assert_report(tmp_path / "reports", result)


def _assert_report(reports, result):
    """4 replicas of 2 IPUs: every IPU a track of the trace with one stage's passes; the step estimate's card has the MLP's 4810 parameters and
    260 input bytes per sample (64 float32 features, an int32 label) read from the run."""
    import json
    report = json.loads((reports / "report-0.json").read_text())
    card = report["step_estimate"]["card"]
    assert (card["params"], card["input_bytes_per_item"]) == (4810, 260), describe(result)
    trace = json.loads((reports / "trace-0.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1}
    assert sorted(names.values()) == [f"IPU {i}" for i in range(8)]
    passes = {}
    for e in events:
        if e["ph"] == "X" and e["pid"] == 1 and e["name"][:1] in "FB":
            passes.setdefault(names[e["tid"]], set()).add(e["name"])
    # each IPU runs one stage's passes, 4 IPUs per stage (which IPUs: the 8-IPU device's
    # order, 0 1 2 3 7 6 5 4 on a POD16, replica r on its places 2r, 2r+1)
    assert sorted(map(sorted, passes.values())) == [["B0", "F0"]] * 4 + [["B1", "F1"]] * 4
    assert passes["IPU 0"] == {"F0", "B0"} and passes["IPU 1"] == {"F1", "B1"}
    assert "ipupod report: POD16" in result.stdout and "step estimate:" in result.stdout
