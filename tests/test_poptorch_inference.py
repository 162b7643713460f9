"""Inference calls and the errors of a wrapped model (poptorch reference §3, §5, §11.3-4,
§11.11)."""

import pytest
import torch

import poptorch
from poptorch import enums
from tests.poptorch_models import WithLoss, mlp


def test_inference_output_modes():  # §11.4
    net = torch.nn.Linear(6, 20)
    x = torch.randn(10, 1, 5, 6)
    with torch.no_grad():
        cpu = net(x)
    cases = {None: (cpu, (10, 1, 5, 20)),
             (enums.OutputMode.EveryN, 5): (cpu[[4, 9]], (2, 1, 5, 20)),
             (enums.OutputMode.Final, None): (cpu[9:], (1, 1, 5, 20)),
             (enums.OutputMode.Sum, None): (cpu.sum(0, keepdim=True), (1, 1, 5, 20))}
    for mode, (expected, shape) in cases.items():
        opts = poptorch.Options().deviceIterations(10)
        if mode is not None:
            opts.outputMode(*mode)
        model = poptorch.inferenceModel(net, opts)
        out = model(x)
        assert out.shape == shape and torch.allclose(out, expected, atol=1e-6)
        model.destroy()


def test_replicated_inference_keeps_the_input_order():
    net = mlp()
    model = poptorch.inferenceModel(net, poptorch.Options().replicationFactor(2)
                                    .deviceIterations(3))
    x = torch.randn(12, 6)
    with torch.no_grad():
        assert torch.allclose(model(x), net(x), atol=1e-6)
    model.destroy()


def test_structures_and_dtypes_of_outputs():
    class Many(torch.nn.Module):
        def forward(self, x):
            return {"sum": x.sum(), "rows": [x.long(), x.double()], "constant": 7}

    model = poptorch.inferenceModel(Many(), poptorch.Options().deviceIterations(2))
    out = model(torch.ones(4, 3))
    assert out["sum"].shape == (2,) and out["constant"] == 7
    assert out["rows"][0].dtype == torch.int32 and out["rows"][1].dtype == torch.float32
    model.destroy()


def test_the_batch_must_be_a_multiple_of_the_steps():  # §11.3
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(3)
    model = poptorch.trainingModel(WithLoss(mlp()), opts)
    with pytest.raises(AssertionError) as info:
        model(torch.zeros(10, 6), torch.zeros(10, dtype=torch.long))
    assert ("the batch dimension (10) must be a multiple of Options.deviceIterations(2) * "
            "(Options.replicationFactor(1) / Options.inputReplicaGrouping.input_group_size(1)) "
            "* Options.Training.gradientAccumulation(3) = 6") in str(info.value)


def test_later_calls_must_match_the_compiled_inputs():
    model = poptorch.inferenceModel(mlp())
    model(torch.zeros(2, 6))
    with pytest.raises(poptorch.Error, match=r"Shape mismatch for input: expected "
                                             r"torch.Size\(\[2, 6\]\) but got "
                                             r"torch.Size\(\[4, 6\]\)"):
        model(torch.zeros(4, 6))
    with pytest.raises(poptorch.Error, match="Data type mismatch for input"):
        model(torch.zeros(2, 6, dtype=torch.float64))
    with pytest.raises(poptorch.Error, match="Number of positional arguments mismatch"):
        model(torch.zeros(2, 6), torch.zeros(2))
    model.destroy()


def test_wrapping_errors():
    with pytest.raises(poptorch.Error, match=r"Invalid type: 'options' is of type <class "
                                             r"'dict'> \(Expected poptorch.Options\)"):
        poptorch.inferenceModel(mlp(), {"deviceIterations": 2})
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match=r"You must set poptorch.Options\(\).Training."
                                             r"gradientAccumulation to 1"):
        poptorch.inferenceModel(mlp(), opts)
    net = WithLoss(mlp())
    training = poptorch.trainingModel(net)
    with pytest.raises(RuntimeError, match="Model has already been wrapped in "
                                           "'poptorch.trainingModel'"):
        poptorch.trainingModel(net)
    training(torch.zeros(1, 6), torch.zeros(1, dtype=torch.long))
    training.destroy()
    poptorch.trainingModel(net).destroy()  # not compiled: destroy does nothing


def test_replication_factor_must_match_poprun(monkeypatch):
    for name, value in (("POPDIST_NUM_TOTAL_REPLICAS", "4"), ("POPDIST_NUM_LOCAL_REPLICAS", "2"),
                        ("POPDIST_REPLICA_INDEX_OFFSET", "0")):
        monkeypatch.setenv(name, value)
    opts = poptorch.Options()
    assert opts.Distributed.numProcesses == 2  # from poprun's environment
    model = poptorch.trainingModel(WithLoss(mlp()), opts)
    with pytest.raises(poptorch.Error, match=r"replicationFactor\(1\) over 2 processes does "
                                             r"not match poprun's 2 local replicas"):
        model(torch.zeros(1, 6), torch.zeros(1, dtype=torch.long))


def test_attributes_fall_through_to_the_user_model():
    net = WithLoss(mlp())
    model = poptorch.inferenceModel(net)
    assert model.net is net.net and model.model is net
    assert model.getTensorNames()[0] == "net.0.weight"


def test_compiled_mode_flags_stay_as_compiled():
    net = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Dropout(0.9))
    net.eval()
    model = poptorch.inferenceModel(net)
    x = torch.ones(2, 6)
    first = model(x).clone()
    net.train()  # PopTorch compiled the model in eval mode: no dropout in later calls
    assert torch.equal(model(x), first) and net.training
    model.destroy()


def test_perf_counters_and_times():
    model = poptorch.inferenceModel(mlp(), poptorch.Options().deviceIterations(2))
    assert model.getPerfCounters()["input"] == [[]]
    with pytest.raises(poptorch.Error, match="Please compile the model before obtaining"):
        model.compilationTime()
    model(torch.zeros(4, 6))
    counters = model.getPerfCounters()
    assert len(counters["input"][0]) == 2 and counters["output_complete"][0][0] >= \
        counters["input"][0][0]
    low, high, avg = model.getLatency()
    assert 0 <= low <= avg <= high
    assert model.compilationTime().total_seconds() >= 0
    with pytest.raises(poptorch.Error, match="Cycle count logging is disabled"):
        model.cycleCount()
    model.destroy()


def test_ops(capsys):
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    out = poptorch.ipu_print_tensor(t * 2, "doubled")
    out.sum().backward()
    printed = capsys.readouterr().out
    assert "doubled: (2., 4.)" in printed and "doubled_gradient: (1., 1.)" in printed
    assert poptorch.for_loop(3, lambda a: [a * 2], [torch.ones(1)])[0].item() == 8
    with pytest.raises(ValueError, match="expects input tensors"):
        poptorch.for_loop(1, lambda a: a, torch.ones(1))
    assert poptorch.nop(t) is t and not poptorch.isRunningOnIpu()
    with pytest.raises(AssertionError, match="No IPU hardware available"):
        poptorch.ipuHardwareVersion()


def test_export_and_load(tmp_path):
    net = mlp()
    model = poptorch.inferenceModel(net, poptorch.Options().deviceIterations(2))
    with pytest.raises(poptorch.Error, match="Model has not been compiled"):
        model.save(str(tmp_path / "early.pt"))
    x = torch.randn(4, 6)
    model.compileAndExport(str(tmp_path / "model.pt"), x)
    expected = model(x)
    model.destroy()
    loaded = poptorch.load(str(tmp_path / "model.pt"),
                           edit_opts_fn=lambda opts: opts.outputMode(enums.OutputMode.Final))
    assert loaded.options.device_iterations == 2
    assert torch.allclose(loaded(x), expected[2:], atol=1e-6)  # Final: the last micro-batch
    loaded.destroy()
    model = poptorch.inferenceModel(net)
    model.compileAndExport(str(tmp_path / "bare.pt"), x, export_model=False)
    with pytest.raises(AssertionError, match="The model was not exported"):
        poptorch.load(str(tmp_path / "bare.pt"))
    model.loadExecutable(str(tmp_path / "bare.pt"))
    with pytest.raises(poptorch.Error, match="is the export of an inference model"):
        poptorch.trainingModel(WithLoss(mlp())).loadExecutable(str(tmp_path / "bare.pt"))
    model.destroy()
