"""Models on the emulated IPUs: attach on compile, release on detach/destroy, gc-monitor's
view, PopTorch's acquire and out-of-memory errors, the IPU count rules (poptorch reference
§5.6, §7.4)."""

import pytest
import torch

import ipu_node
import poptorch
from ipu_node.runtime.occupancy import Occupancy, default_scope
from tests.poptorch_models import WithLoss, mlp


def _holders(system: str = "POD16") -> dict[int, str]:
    return {h.ipu_id: h.device for h in Occupancy(system, default_scope()).holders(False)}


def _data(rows: int):
    return torch.randn(rows, 6), torch.randint(0, 3, (rows,))


@pytest.fixture
def pod4(monkeypatch):
    monkeypatch.setenv("IPUPOD_SYSTEM", "POD4")
    yield
    ipu_node.reset_ipu_configuration()


def test_compile_attaches_and_detach_releases():
    model = poptorch.inferenceModel(mlp())
    assert not model.isAttachedToDevice()
    model.compile(torch.zeros(2, 6))
    held = [i for i, label in _holders().items() if label.startswith("poptorch inference")]
    assert model.isAttachedToDevice() and len(held) == 1
    model.detachFromDevice()
    assert held[0] not in _holders() and not model.isAttachedToDevice()
    model(torch.zeros(2, 6))  # a call attaches again
    assert model.isAttachedToDevice() and held[0] in _holders()
    model.destroy()
    assert held[0] not in _holders() and not model.isCompiled()


def test_attach_and_detach_errors():
    model = poptorch.inferenceModel(mlp())
    with pytest.raises(poptorch.Error, match="Model has not been compiled or has been "
                                             "destroyed."):
        model.detachFromDevice()
    with pytest.raises(poptorch.Error, match="Model has not been compiled"):
        model.attachToDevice()
    model.compile(torch.zeros(1, 6))
    model.compile(torch.zeros(1, 6))  # warns, ignored
    with pytest.raises(poptorch.Error, match="Device is already attached"):
        model.attachToDevice()
    model.detachFromDevice()
    with pytest.raises(poptorch.Error, match="Device is not attached"):
        model.detachFromDevice()
    model.destroy()


def test_two_models_needing_more_ipus_than_free_fail_to_acquire(pod4):
    net = mlp()
    training = poptorch.trainingModel(WithLoss(net), poptorch.Options().replicationFactor(4))
    training(*_data(4))
    assert sorted(_holders("POD4")) == [0, 1, 2, 3]
    inference = poptorch.inferenceModel(net)
    with pytest.raises(poptorch.Error, match=r"Failed to acquire 1 IPU\(s\)"):
        inference(torch.zeros(1, 6))
    training.detachFromDevice()  # the alternation pattern of the seeds' program
    inference(torch.zeros(1, 6))
    with pytest.raises(poptorch.Error, match=r"Failed to acquire 4 IPU\(s\)"):
        training(*_data(4))
    inference.detachFromDevice()
    training(*_data(4))  # attaches again
    assert training.isAttachedToDevice()
    training.destroy()


def test_replicated_training_runs_on_the_ipu_system_and_counts_sram():
    net = mlp(hidden=32)
    opts = poptorch.Options().replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    model = poptorch.trainingModel(WithLoss(net), opts,
                                   torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    model(*_data(4))
    system = ipu_node.get_system()
    assert system.num_local_replicas == 2
    params = sum(p.nbytes for p in net.parameters())
    for ctx in (system.replica_context(r) for r in range(2)):
        tensors = system.memory[ctx.ipus[0].id].tensors()
        assert sum(n for name, n in tensors.items() if "/param/" in name) == params
        assert sum(n for name, n in tensors.items() if "/optimizer/velocity/" in name) == params
        assert sum(n for name, n in tensors.items() if "/accumulator/" in name) == params
    model.detachFromDevice()
    assert not system.ipus_attached and system.memory[0].in_use_bytes == 0
    model.destroy()


def test_parameters_that_do_not_fit_give_the_out_of_memory_error():
    class Huge(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # 1.2e9 bytes counted, 4 bytes stored: an expanded view
            self.w = torch.nn.Parameter(torch.zeros(1).expand(300_000_000),
                                        requires_grad=False)

        def forward(self, x):
            return x * self.w[0]

    model = poptorch.inferenceModel(Huge())
    with pytest.raises(poptorch.Error, match=r"Out of memory.*IPU \d+ \(IPU 0 of replica 0\) "
                                             r"needs 1,2\d\d,\d{3},\d{3} bytes, it has "
                                             r"940,572,672 bytes.*largest tensors: "
                                             r"'inference/param/w' \(1,200,000,000 bytes\)"):
        model(torch.zeros(1))
    assert not model.isCompiled()


def test_ipu_counts_are_powers_of_two():
    opts = poptorch.Options().replicationFactor(3)
    with pytest.raises(poptorch.Error, match="The model specifies the use of 3 IPUs, however "
                                             "PopTorch must reserve a minimum of 4"):
        poptorch.inferenceModel(mlp(), opts)(torch.zeros(3, 6))
    model = poptorch.inferenceModel(mlp(), poptorch.Options().replicationFactor(3)
                                    .autoRoundNumIPUs(True))
    assert model(torch.zeros(3, 6)).shape == (3, 3)
    model.destroy()
    with pytest.raises(poptorch.Error, match=r"Too many IPUs requested \(128\)"):
        poptorch.inferenceModel(mlp(), poptorch.Options().replicationFactor(128))(
            torch.zeros(128, 6))


def test_use_ipu_id_attaches_that_device():
    model = poptorch.inferenceModel(mlp(), poptorch.Options().replicationFactor(2).useIpuId(17))
    model(torch.zeros(2, 6))
    assert {2, 3} <= set(_holders())
    model.destroy()


def test_connection_type_never_compiles_without_attaching():
    opts = poptorch.Options().connectionType(poptorch.ConnectionType.Never)
    model = poptorch.inferenceModel(mlp(), opts)
    model.compile(torch.zeros(1, 6))
    assert model.isCompiled() and not model.isAttachedToDevice()
    with pytest.raises(AssertionError, match=r"use model.compile\(inputs\) instead"):
        model(torch.zeros(1, 6))


def test_a_system_configured_with_the_model_s_layout_is_used_as_it_is():
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 2
    system = cfg.configure_ipu_system()   # e.g. what a program does before hvd.init()
    from collectives import cross_replica_sum
    from collectives.strategies import IPUMultiReplicaStrategy
    strategy = IPUMultiReplicaStrategy()
    model = poptorch.trainingModel(WithLoss(mlp()), poptorch.Options().replicationFactor(2))
    model(*_data(2))
    assert ipu_node.get_system() is system
    model.detachFromDevice()
    # the system's collectives still work beside the detached model
    import numpy as np
    assert strategy.run(lambda: cross_replica_sum(np.ones(2, np.float32)))[0].tolist() == [2, 2]
    model.destroy()
    ipu_node.reset_ipu_configuration()
