"""The memory of a Keras model on its IPUs, the out-of-memory error at compile, the run report
and the model card of a TF run (issue 32 item 6; :mod:`ipu_tensorflow._keras_memory`)."""

import json
import os
import sys
import textwrap

import numpy as np
import pytest

from tests.tf_helpers import TF_MARKS, ipus  # noqa: F401

pytestmark = TF_MARKS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nbytes(variables) -> int:
    return int(sum(np.prod(v.shape.as_list()) * v.dtype.size for v in variables))


def test_a_model_that_fits_is_counted_on_every_replicas_ipu(ipus):
    import ipu_node
    import tensorflow as tf
    from collectives.performance.memory_plan import CODE_AND_EXCHANGE_FRACTION
    from collectives.step_model import ModelCard
    ipu = ipus(2)
    x = np.random.RandomState(0).rand(64, 8).astype(np.float32)
    y = np.random.RandomState(1).rand(64, 2).astype(np.float32)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu",
                                                           input_shape=(8,)),
                                     tf.keras.layers.Dense(2)])
        model.compile(loss="mse", optimizer="adam", steps_per_execution=4)
        with pytest.raises(RuntimeError, match="call `fit` first"):
            model.modelReport()
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    report = model.modelReport()
    usage = ipu_node.memory_usage()
    ids = [ctx.ipus[0].id for ctx in (ipu_node.get_system().replica_context(r)
                                       for r in range(2))]
    assert sorted(report.memory) == sorted(ids)
    params = _nbytes(model.trainable_variables)
    for i in ids:
        m = report.memory[i]
        assert m["parameters"] == params
        # Adam: m and v per parameter, and its int64 iteration counter
        assert m["optimizer_state"] == 2 * params + 8
        # the backward pass reads the batch (8 x 8) and the ReLU's output (8 x 16)
        assert m["activations"] >= (8 * 8 + 8 * 16) * 4
        assert m["code_and_exchange"] == int(m["capacity"] * CODE_AND_EXCHANGE_FRACTION)
        assert usage[i].in_use_bytes == m["total"] == sum(
            m[k] for k in ("parameters", "optimizer_state", "activations",
                           "code_and_exchange"))
    assert report.steps == 64 // (8 * 2) and report.step_s > 0
    assert report.front_end == "tensorflow" and "tensorflow model 'sequential" in report.table()
    card = ModelCard.from_run(run=report)
    assert card.params == model.count_params() and card.flops_per_item > 0


def test_a_model_too_big_raises_the_out_of_memory_error_before_its_first_step(ipus):
    import ipu_node
    import tensorflow as tf
    ipu = ipus(1)
    with ipu.ipu_strategy.IPUStrategy().scope():
        # 16 tanh layers of 256 x 64 x 1024 float32 (67 MB each) kept for the backward pass
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(1024, input_shape=(16,)), tf.keras.layers.RepeatVector(64)]
            + [tf.keras.layers.Activation("tanh") for _ in range(16)]
            + [tf.keras.layers.GlobalAveragePooling1D(), tf.keras.layers.Dense(1)])
        model.compile(loss="mse", optimizer="sgd")
        before = [w.copy() for w in model.get_weights()]
        used = {i: u.in_use_bytes for i, u in ipu_node.memory_usage().items()}
        with pytest.raises(ipu_node.IPUOutOfMemoryError) as info:
            model.fit(np.ones((256, 16), np.float32), np.ones((256, 1), np.float32),
                      batch_size=256, verbose=0)
    err = info.value
    ipu_id = ipu_node.get_system().replica_context(0).ipus[0].id
    assert err.ipu_id == ipu_id and err.needed_bytes > err.available_bytes
    assert err.needed_bytes >= 16 * 256 * 64 * 1024 * 4
    text = str(err)
    assert f"IPU {ipu_id} is out of memory" in text and "largest tensors" in text
    assert f"{model.name}/activations/stage0" in text and f"{model.name}/param/" in text
    # nothing stays placed and no step ran
    assert {i: u.in_use_bytes for i, u in ipu_node.memory_usage().items()} == used
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


_PROGRAM = textwrap.dedent("""
    import numpy as np
    from tensorflow.python import ipu
    import tensorflow as tf
    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    x = np.random.RandomState(0).rand(64, 8).astype(np.float32)
    y = np.random.RandomState(1).rand(64, 2).astype(np.float32)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu",
                                                           input_shape=(8,)),
                                     tf.keras.layers.Dense(2)], name="small")
        model.compile(loss="mse", optimizer="adam", steps_per_execution=2)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
""")


@pytest.mark.parametrize("asked_by", ["IPUPOD_REPORT_DIR", "POPLAR_ENGINE_OPTIONS"])
def test_ipupod_report_reads_a_one_process_keras_runs_report(tmp_path, capsys, asked_by):
    from collectives.performance import report_cli
    from tests.procs import child_env, run
    script = tmp_path / "prog.py"
    script.write_text(_PROGRAM)
    reports = tmp_path / "reports"
    env = child_env(IPUPOD_REPORT_DIR=str(reports)) if asked_by == "IPUPOD_REPORT_DIR" else \
        child_env(IPUPOD_REPORT_DIR="", POPLAR_ENGINE_OPTIONS=json.dumps(
            {"autoReport.all": "true", "autoReport.directory": str(reports)}))
    done = run([sys.executable, str(script)], 240, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (reports / "trace-0.json").is_file()
    path = reports / "report-0.json"
    report = json.loads(path.read_text())
    (entry,) = report["sections"]["tensorflow"]["models"]
    assert entry["name"] == "small" and entry["steps"] == 8
    (ipu_id,) = report["ipus"]
    assert report["ipus"][ipu_id]["memory_peak_bytes"] == entry["memory"][ipu_id]["total"]
    assert report["step_estimate"]["card"]["params"] == 8 * 16 + 16 + 16 * 2 + 2
    assert report_cli.main([str(path), "--out", str(tmp_path / "png")]) == 0
    out = capsys.readouterr().out
    assert "tensorflow model 'small': single stage" in out and "modelled step" in out
    assert f"IPU {ipu_id}:" in out and "optimizer_state" in out
    assert sorted(os.listdir(tmp_path / "png")) == ["report-0-breakdown.png",
                                                   "report-0-scaling.png"]
