"""popdist.poptorch.Options (poptorch reference §8, §11.15), and the seeds' PopTorch program
(seed 001:1399-1487) run as it is on a tiny data set."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import popdist.poptorch
import poptorch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_digits_poptorch.py"


@pytest.fixture
def poprun_env(monkeypatch):
    for name, value in (("POPDIST_NUM_TOTAL_REPLICAS", "8"), ("POPDIST_NUM_LOCAL_REPLICAS", "2"),
                        ("POPDIST_REPLICA_INDEX_OFFSET", "4"),
                        ("POPDIST_NUM_IPUS_PER_REPLICA", "1")):
        monkeypatch.setenv(name, value)


def test_outside_poprun_it_is_one_process():  # §11.15
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    assert opts.Distributed.processId == 0 and opts.Distributed.numProcesses == 1
    assert opts.replication_factor == 1 and not opts.exists("ipu_id")


def test_under_poprun_it_takes_the_instance_s_replicas(poprun_env):
    opts = popdist.poptorch.Options()
    assert opts.replication_factor == 2
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (2, 4)
    assert opts.ipu_id == 18  # the gc-info device of IPUs 4 and 5 on POD16
    clone = opts.clone()
    assert isinstance(clone, popdist.poptorch.Options) and clone.replication_factor == 2
    loader = poptorch.DataLoader(opts, torch.utils.data.TensorDataset(torch.arange(64)),
                                 batch_size=2)
    assert loader.combinedBatchSize == 4 and len(loader) == 4  # 16 rows of 64 per instance
    with pytest.raises(ValueError, match="--ipus-per-replica 1"):
        popdist.poptorch.Options(ipus_per_replica=2)


@pytest.mark.parametrize("name, args", [("replicationFactor", (1,)), ("useIpuId", (0,)),
                                        ("Distributed.disable", ()),
                                        ("Distributed.setEnvVarNames", ("A", "B")),
                                        ("Distributed.configureProcessId", (1, 2))])
def test_blocked_methods(name, args):
    target = popdist.poptorch.Options(ipus_per_replica=1)
    *groups, method = name.split(".")
    for group in groups:
        target = getattr(target, group)
    with pytest.raises(RuntimeError, match=f"Cannot call `{name}` with "
                                           r"popdist\.poptorch\.Options"):
        getattr(target, method)(*args)


def test_the_seed_program_runs_as_it_is():
    """The seed's IPU program (seed 001:1440-1485), with the example's network and a small
    random data set in place of MNIST."""
    spec = importlib.util.spec_from_file_location("train_digits_poptorch", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("train_digits_poptorch", example)
    spec.loader.exec_module(example)
    images = torch.randn(96, 1, 8, 8)
    labels = torch.randint(0, 10, (96,))
    dataset = torch.utils.data.TensorDataset(images, labels)

    opts = poptorch.Options().deviceIterations(4)
    training_data = poptorch.DataLoader(opts, dataset, batch_size=8, shuffle=True,
                                        drop_last=True)
    test_data = poptorch.DataLoader(opts, dataset, batch_size=8, shuffle=True, drop_last=True)
    model = example.Network()
    training_model = example.TrainingModelWithLoss(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    training_model = poptorch.trainingModel(training_model, opts, optimizer=optimizer)
    inference_model = poptorch.inferenceModel(model)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        for data, labels in training_data:
            preds, losses = training_model(data, labels)
            assert preds.shape == (8, 10) and losses.shape == ()
    training_model.detachFromDevice()
    sum_acc = 0.0
    with torch.no_grad():
        for data, labels in test_data:
            output = inference_model(data)
            assert output.shape == (32, 10)
            sum_acc += example.accuracy(output, labels)
    assert 0.0 <= sum_acc / len(test_data) <= 1.0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    inference_model.destroy()
    training_model.destroy()
