"""Graphcore's CNN application's patterns as jobs (issue 34): a BatchNorm ResNet trained with
4 replicas in one process and under ``poprun -n 2 --num-replicas 4`` gives the same bits,
running statistics included; Horovod beside poptorch under poprun; one report per instance
that ``ipupod-report`` reads."""

import json

import pytest

from tests.procs import PYTHON, ROOT, child_env, describe, poprun, run

pytestmark = pytest.mark.slow  # starts processes, runs training jobs (tests/conftest.py)

#: the program, started as the interpreter does with ipupod_aliases.pth installed (its one
#: line, for an environment installed before the .pth existed): horovod.torch is served
PROGRAM = ["-c", "import ipupod_aliases; ipupod_aliases.install(); import runpy; "
           "runpy.run_module('tests.programs.poptorch_resnet', run_name='__main__')"]


def _digests(stdout: str) -> dict[int, str]:
    found = {}
    for line in stdout.splitlines():
        if "digest=" in line:
            fields = dict(f.split("=", 1) for f in line.split(">:")[-1].split())
            found[int(fields["instance"])] = fields["digest"]
    return found


def test_a_batchnorm_resnet_gives_the_same_bits_at_both_layouts_beside_horovod(tmp_path):
    single = run([PYTHON, *PROGRAM], timeout_s=180, env=child_env(), cwd=ROOT)
    assert single.returncode == 0, describe(single)
    job = poprun(["-n", "2", "--num-replicas", "4", "--report-dir", str(tmp_path), PYTHON,
                  *PROGRAM, "hvd"], timeout_s=240)
    assert job.returncode == 0, describe(job)
    digests = _digests(job.stdout)
    assert sorted(digests) == [0, 1]
    assert digests[0] == _digests(single.stdout)[0]   # instance 0 holds global replica 0
    assert digests[1] != digests[0]        # its first replica's own running statistics
    hvd = [line.split(">:")[-1] for line in job.stdout.splitlines() if "hvd rank=" in line]
    assert len(hvd) == 2 and len({line.split(" ", 2)[2] for line in hvd}) == 1, hvd
    assert "size=2" in hvd[0] and "replicas=4 gathered=4 objects=[0, 1]" in hvd[0]

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report-0.json", "report-1.json", "trace-0.json", "trace-1.json"]
    report = json.loads((tmp_path / "report-1.json").read_text())
    assert report["instance"] == 1 and report["replicas"] == 4
    assert {c["op"] for c in report["collectives"]} >= {"cross_replica_sum"}
    assert report["sections"]["poptorch"]["models"][0]["global_replicas"] == 4
    cli = run([PYTHON, "-m", "collectives.performance.report_cli", str(tmp_path / "report-1.json")],
              timeout_s=120, env=child_env(), cwd=ROOT)
    assert cli.returncode == 0, describe(cli)
    assert "cross_replica_sum" in cli.stdout and "poptorch model 'training'" in cli.stdout


def test_several_async_loaders_with_workers_leave_no_tracebacks_and_no_processes():
    """Graphcore's efficient-data-loading tutorial's pattern (tests/programs/
    poptorch_loaders.py): each dropped loader lets its worker processes go."""
    result = run([PYTHON, "-m", "tests.programs.poptorch_loaders"], timeout_s=180,
                 env=child_env(), cwd=ROOT)
    assert result.returncode == 0, describe(result)
    assert result.stdout.count("batches=8") == 4, describe(result)
    assert "children=0" in result.stdout, describe(result)
    assert "Exception ignored" not in result.stderr, describe(result)
