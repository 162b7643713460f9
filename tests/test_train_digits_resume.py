"""Checkpoints that resume (issue 11, deliverable 6): ``examples/train_digits.py --resume``.

A run stopped after an epoch and resumed writes checkpoints with the same bytes as a run that
was never stopped, at two layouts; a kill during a checkpoint write leaves the previous
checkpoint whole, and the temporary file is removed by the next run.
"""

import numpy as np
import pytest

from tests.procs import ROOT, describe, run_poprun, wait_no_processes

pytestmark = pytest.mark.slow  # starts processes (tests/conftest.py)

EXAMPLE = str(ROOT / "examples" / "train_digits.py")
EPOCHS = ["--epochs", "3"]
LAYOUTS = {"2x2": ["-n", "2", "--num-replicas", "4"], "1x2": ["-n", "1", "--num-replicas", "2"]}


def _train(ckpt, layout, *example_args, env=None, expect=0):
    result = run_poprun([*LAYOUTS[layout], "python", EXAMPLE, "--checkpoint-dir", str(ckpt),
                         *EPOCHS, *example_args], 120, env=env)
    assert result.returncode == expect, describe(result)
    return result


def _files(ckpt) -> dict:
    return {p.name: p.read_bytes() for p in sorted(ckpt.iterdir())}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = {}
    for layout in LAYOUTS:
        ckpt = tmp_path_factory.mktemp("uninterrupted") / layout
        _train(ckpt, layout)
        out[layout] = _files(ckpt)
    return out


@pytest.mark.parametrize("layout, stop_after", [("2x2", 1), ("1x2", 2)])
def test_a_run_stopped_and_resumed_writes_the_same_bytes(tmp_path, uninterrupted, layout,
                                                         stop_after):
    ckpt = tmp_path / "ckpt"
    _train(ckpt, layout, "--stop-after-epoch", str(stop_after))
    stopped = _files(ckpt)
    assert stopped.keys() == uninterrupted[layout].keys()
    with np.load(ckpt / "instance_0.npz") as saved:
        assert int(saved["epoch"]) == stop_after
        assert {"W1", "b1", "W2", "b2", "velocity_W1", "velocity_b1", "velocity_W2",
                "velocity_b2", "epoch", "step", "losses", "data_order", "rng_state",
                "test_accuracy"} <= set(saved.files)
    _train(ckpt, layout, "--resume")
    assert _files(ckpt) == uninterrupted[layout]


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_and_resumes(tmp_path,
                                                                              uninterrupted):
    ckpt = tmp_path / "ckpt"
    _train(ckpt, "2x2", env={"TRAIN_DIGITS_TEST_KILL_DURING_WRITE": "2"}, expect=137)
    assert wait_no_processes(EXAMPLE) == []
    names = sorted(p.name for p in ckpt.iterdir())
    assert any(n.startswith(".instance_") and ".tmp-" in n for n in names), names
    for i in range(2):
        with np.load(ckpt / f"instance_{i}.npz") as saved:   # whole, from epoch 1
            assert int(saved["epoch"]) == 1

    # instances whose checkpoints are epochs apart are refused, naming why
    epoch1 = (ckpt / "instance_1.npz").read_bytes()
    (ckpt / "instance_1.npz").write_bytes(uninterrupted["2x2"]["instance_1.npz"])
    result = _train(ckpt, "2x2", "--resume", expect=1)
    assert "checkpoints in" in result.stderr and "are at different epochs" in result.stderr, \
        describe(result)

    (ckpt / "instance_1.npz").write_bytes(epoch1)
    _train(ckpt, "2x2", "--resume")
    assert _files(ckpt) == uninterrupted["2x2"]   # the temporary files are gone too
