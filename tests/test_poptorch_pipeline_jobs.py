"""PopTorch pipelines as whole jobs (issue 23): the same bits at every layout of a pipelined
model's replicas over instances; the fifth main job under poprun reaches its accuracy, prints
its modelled step, bubble and memory, and writes the run report and trace that
``ipupod-report`` draws."""

import json

import numpy as np
import pytest

from tests.procs import PROGRAMS, PYTHON, ROOT, child_env, describe, poprun, run
from tests.test_poptorch_multiprocess import parse_digests

pytestmark = pytest.mark.slow  # starts processes, runs training jobs (tests/conftest.py)

PROGRAM = str(PROGRAMS / "poptorch_layout.py")
EXAMPLE = str(ROOT / "examples" / "train_digits_poptorch_pipelined.py")


def test_a_pipelined_model_gives_the_same_bits_at_every_layout():
    single = run([PYTHON, PROGRAM, "sgd", "pipelined"], timeout_s=180, env=child_env(),
                 cwd=ROOT)
    assert single.returncode == 0, describe(single)
    digest, losses = parse_digests(single.stdout)[0]
    assert losses.shape == (3, 4)
    for n in ("2", "4"):
        job = poprun(["-n", n, "--num-replicas", "4", "--ipus-per-replica", "2", PYTHON,
                      PROGRAM, "sgd", "pipelined"], timeout_s=240)
        assert job.returncode == 0, describe(job)
        found = parse_digests(job.stdout)
        assert sorted(found) == list(range(int(n)))
        assert {d for d, _ in found.values()} == {digest}, (n, found)
        gathered = np.concatenate([found[i][1] for i in sorted(found)], axis=1)
        assert gathered.tobytes() == losses.tobytes()


def test_the_fifth_main_job_under_poprun(tmp_path):
    result = poprun(["-n", "2", "--num-replicas", "2", "--ipus-per-replica", "2",
                     "--report-dir", str(tmp_path), "python", EXAMPLE], timeout_s=300)
    assert result.returncode == 0, describe(result)
    lines = result.stdout.strip().splitlines()
    ours = [line.split(">:", 1)[-1] for line in lines if line.startswith("[1,0]")]
    accuracy = float(next(line for line in ours if line.startswith("test_accuracy="))
                     .split("=", 1)[1])
    assert accuracy >= 0.95, describe(result)
    step = next(line for line in ours if line.startswith("modelled step time:"))
    assert "2 replica(s) x 2 IPUs" in step and "bubble fraction 0." in step
    assert sum(line.startswith("memory of IPU") for line in ours) == 2
    report = json.loads((tmp_path / "report-0.json").read_text())
    assert report["replicas"] == 2 and report["ipus_per_replica"] == 2
    compute = {e["label"] for events in report["timeline"].values() for e in events
               if e["kind"] == "compute"}
    assert {"F0", "B0", "F1", "B1", "weight update"} <= compute
    models = report["sections"]["poptorch"]["models"]
    training = next(m for m in models if m["training"] and m["model"])
    assert [s["blocks"] for s in training["model"]["stages"]] == [["convolutions"], ["dense"]]
    assert report["step_estimate"]["card"]["params"] > 0
    trace = json.loads((tmp_path / "trace-0.json").read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "F1" for e in trace)
    from collectives import report_cli
    assert report_cli.main([str(tmp_path / "report-0.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report-0-breakdown.png").exists()
    assert (tmp_path / "report-0-scaling.png").exists()
