"""PopTorch programs under poprun: the same weights and losses, bit for bit, whatever the
layout of the job's 4 replicas over 1, 2 or 4 instances (MPI and gRPC); the fourth main job
reaches its accuracy in one process and under poprun."""

import numpy as np
import pytest

from tests.procs import PROGRAMS, PYTHON, ROOT, child_env, describe, poprun, run

pytestmark = pytest.mark.slow  # starts processes, runs training jobs (tests/conftest.py)

PROGRAM = str(PROGRAMS / "poptorch_layout.py")
EXAMPLE = str(ROOT / "examples" / "train_digits_poptorch.py")


def parse_digests(stdout: str) -> dict[int, tuple[str, np.ndarray]]:
    """Per instance, the weights' digest and the (3, steps) losses that
    tests/programs/poptorch_layout.py printed."""
    found = {}
    for line in stdout.splitlines():
        if "digest=" not in line:
            continue
        fields = dict(f.split("=", 1) for f in line.split(">:")[-1].split())
        losses = np.frombuffer(bytes.fromhex(fields["losses"]), np.float32)
        found[int(fields["instance"])] = (fields["digest"], losses.reshape(3, -1))
    return found


def _job(args: list[str], optimizer: str) -> dict:
    if args:
        result = poprun([*args, PYTHON, PROGRAM, optimizer], timeout_s=180)
    else:
        result = run([PYTHON, PROGRAM, optimizer], timeout_s=120, env=child_env(), cwd=ROOT)
    assert result.returncode == 0, describe(result)
    return parse_digests(result.stdout)


@pytest.mark.parametrize("optimizer", ["sgd", "lamb"])
def test_every_layout_of_the_replicas_gives_the_same_bits(optimizer):
    single = _job([], optimizer)
    digest, losses = single[0]
    assert losses.shape == (3, 4)
    for args in (["-n", "2", "--num-replicas", "4"], ["-n", "4", "--num-replicas", "4"]):
        job = _job(args, optimizer)
        assert sorted(job) == list(range(int(args[1])))
        assert {d for d, _ in job.values()} == {digest}, (args, job)
        gathered = np.concatenate([job[i][1] for i in sorted(job)], axis=1)
        assert gathered.tobytes() == losses.tobytes(), (args, gathered, losses)


def test_the_grpc_transport_gives_the_same_bits():
    digest = _job([], "sgd")[0][0]
    job = _job(["-n", "2", "--num-replicas", "4", "--launcher", "local", "--transport",
                "grpc"], "sgd")
    assert {d for d, _ in job.values()} == {digest}


def _accuracy(stdout: str) -> float:
    last = stdout.strip().splitlines()[-1]
    assert "test_accuracy=" in last, last
    return float(last.rsplit("test_accuracy=", 1)[1])


def test_the_fourth_main_job_in_one_process():
    # Its one replica computes with all the cores. OpenMP's threads spin at each barrier before
    # they sleep (libgomp's default wait policy): on a machine loaded past its cores, a spinning
    # thread holds a core that the thread it waits for needs: beside a second test suite the
    # job was at epoch 9 of 10 after 240 s (11 s alone). Waiting passively changes no result
    # (the same threads, the same partial sums), only how a thread waits.
    result = run([PYTHON, EXAMPLE], timeout_s=240, env=child_env(OMP_WAIT_POLICY="PASSIVE"),
                 cwd=ROOT)
    assert result.returncode == 0, describe(result)
    assert _accuracy(result.stdout) >= 0.95


def test_the_fourth_main_job_under_poprun():
    result = poprun(["-n", "2", "--num-replicas", "4", "python", EXAMPLE], timeout_s=180)
    assert result.returncode == 0, describe(result)
    assert _accuracy(result.stdout) >= 0.95
