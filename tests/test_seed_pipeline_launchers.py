"""The seeds' multi-worker pipelines as written (E11: IPUMultiWorkerStrategy over TF_CONFIG,
seed 004:1991-2067; E12: IPUHorovodStrategy under mpirun, seed 004:2120-2187), with only the
model code replaced (tests/programs/seed_pipeline.py). Oracle: every worker ends with the
weights and global losses of the same training in plain numpy (one replica of two IPUs per
worker, the replication factor derived as TF-IPU derives it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tests.procs import PROGRAMS, PYTHON, ROOT, child_env, run

pytestmark = pytest.mark.slow  # starts jobs (tests/conftest.py)

PROGRAM = str(PROGRAMS / "seed_pipeline.py")


def _oracle(workers: int) -> dict:
    spec = importlib.util.spec_from_file_location("seed_pipeline", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.oracle(workers)


@pytest.mark.parametrize("launcher,kind", [
    ([PYTHON, "-m", "launch.multiworker", "-n", "2"], "multiworker"),
    ([str(Path(PYTHON).parent / "mpirun"), "-n", "2", PYTHON], "horovod"),
    ([PYTHON], "ipu"),
], ids=["E11-multiworker-grpc", "E12-horovod-mpirun", "ipu-strategy-alone"])
def test_the_seeds_multi_worker_pipeline_runs_as_written(launcher, kind, tmp_path):
    job = run([*launcher, PROGRAM, kind], timeout_s=180, cwd=ROOT,
              env=child_env(SEED_PIPELINE_OUT=str(tmp_path), IPUPOD_COLLECTIVE_TIMEOUT_S="60"))
    assert job.returncode == 0, job.stdout + job.stderr
    workers = 1 if kind == "ipu" else 2
    results = [json.loads((tmp_path / f"worker-{w}.json").read_text()) for w in range(workers)]
    expected = _oracle(workers)
    for r in results:
        assert (r["workers"], r["replicas"], r["ipus_per_replica"]) == (workers, workers, 2)
        np.testing.assert_allclose(r["W1"], expected["W1"], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(r["W2"], expected["W2"], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(r["losses"], expected["losses"], rtol=1e-12)
    # every worker holds bit-identical weights and the same global losses
    assert all(r["W1"] == results[0]["W1"] and r["losses"] == results[0]["losses"]
               for r in results)
    assert "DeprecationWarning: create_ipu_config" in job.stderr  # the seeds' warning


def test_poplar_engine_options_autoreport_writes_the_report_and_trace(tmp_path):
    reports = tmp_path / "tommyFlowers"      # seed 001:877's directory name
    options = json.dumps({"autoReport.all": "true", "autoReport.directory": str(reports)})
    job = run([PYTHON, PROGRAM, "ipu"], timeout_s=120, cwd=ROOT,
              env=child_env(POPLAR_ENGINE_OPTIONS=options, IPUPOD_REPORT_DIR=""))
    assert job.returncode == 0, job.stdout + job.stderr
    report = json.loads((reports / "report-0.json").read_text())
    trace = json.loads((reports / "trace-0.json").read_text())
    assert report["options"]["auto_select_ipus"] == 2   # what the program set, by name
    assert report["options"]["optimizations.merge_remote_buffers"] == \
        "MergeRemoteBuffersBehaviour.NO_MERGING"         # create_ipu_config's old default
    assert (report["replicas"], report["ipus_per_replica"]) == (1, 2)
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    assert "options set: auto_select_ipus=2" in job.stdout
    bad = run([PYTHON, PROGRAM, "ipu"], timeout_s=120, cwd=ROOT,
              env=child_env(POPLAR_ENGINE_OPTIONS='{"autoReport.all": true'))
    assert bad.returncode != 0 and "POPLAR_ENGINE_OPTIONS is not valid JSON" in bad.stderr


@pytest.mark.parametrize("instances", [1, 2, 4])
def test_reset_ipu_seed_streams_are_the_same_at_every_layout(instances, tmp_path):
    job = run([PYTHON, "-m", "poprun", "-n", str(instances), "--num-replicas", "4", PYTHON,
               str(PROGRAMS / "seed_streams.py")], timeout_s=120, cwd=ROOT,
              env=child_env(SEED_STREAMS_OUT=str(tmp_path)))
    assert job.returncode == 0, job.stdout + job.stderr
    draws = {}
    for i in range(instances):
        for kind, by_replica in json.loads((tmp_path / f"instance-{i}.json").read_text()).items():
            draws.setdefault(kind, {}).update(by_replica)
    for r in range(4):   # a function of (seed, global replica) only
        assert draws["False"][str(r)] == np.random.default_rng([7, r]).random(3).tolist()
        assert draws["True"][str(r)] == np.random.default_rng([7]).random(3).tolist()
