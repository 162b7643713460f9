"""Training calls: one call equals a plain PyTorch loop with GCL's reduction order, bit for
bit; output shapes per mode; the reduction types; the loss rules (poptorch reference §3-§6,
§11.5-8)."""

import copy

import pytest
import torch

import poptorch
from poptorch import enums
from tests.poptorch_models import WithLoss, mlp, plain_call


def _data(rows: int, n_in: int = 6, classes: int = 3, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, n_in, generator=g), torch.randint(0, classes, (rows,), generator=g)


def _options(di=1, R=1, G=1, reduction=None):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(R)
    opts.Training.gradientAccumulation(G)
    if reduction is not None:
        opts.Training.accumulationAndReplicationReductionType(reduction)
    return opts


@pytest.mark.parametrize("reduction", [enums.ReductionType.Mean, enums.ReductionType.Sum])
def test_a_call_equals_the_plain_loop_bit_for_bit(reduction):
    di, G, R, B = 2, 3, 4, 5
    net = mlp()
    ref = copy.deepcopy(net)
    x, y = _data(di * G * R * B)
    model = poptorch.trainingModel(WithLoss(net), _options(di, R, G, reduction),
                                   torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for _ in range(2):
        _, losses = model(x, y)
        expected = plain_call(ref, ref_opt, x, y, di, G, R,
                              mean=reduction == enums.ReductionType.Mean)
    for p, q in zip(net.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert torch.equal(losses, torch.stack(expected))
    model.destroy()


def test_adam_and_lamb_match_their_plain_steps():
    for make in (lambda p: poptorch.optim.Adam(p, lr=0.01),
                 lambda p: poptorch.optim.LAMB(p, lr=0.01)):
        net = mlp()
        ref = copy.deepcopy(net)
        x, y = _data(2 * 2 * 3)
        model = poptorch.trainingModel(WithLoss(net), _options(2, 2), make(net.parameters()))
        ref_opt = make(ref.parameters())
        model(x, y)
        plain_call(ref, ref_opt, x, y, 2, 1, 2)
        assert all(torch.equal(p, q) for p, q in zip(net.parameters(), ref.parameters()))
        model.destroy()


def test_output_shapes_per_mode_in_training():  # §11.5 (di 100 instead of 1000)
    x, y = _data(100, classes=3)
    shapes = {}
    for mode, period in ((enums.OutputMode.Final, None), (enums.OutputMode.All, None),
                         (enums.OutputMode.EveryN, 20), (enums.OutputMode.Sum, None)):
        opts = _options(100).outputMode(mode, period)
        net = mlp(n_out=3)
        model = poptorch.trainingModel(WithLoss(net), opts,
                                       torch.optim.SGD(net.parameters(), lr=0.0))
        out, loss = model(x, y)
        shapes[mode] = (tuple(out.shape), tuple(loss.shape))
        if mode == enums.OutputMode.Sum:
            per_item = torch.nn.functional.cross_entropy(net(x), y, reduction="none")
            assert torch.allclose(loss, per_item.sum(), rtol=1e-5)
        model.destroy()
    assert shapes == {enums.OutputMode.Final: ((1, 3), ()),
                      enums.OutputMode.All: ((100, 3), (100,)),
                      enums.OutputMode.EveryN: ((5, 3), (5,)),
                      enums.OutputMode.Sum: ((1, 3), ())}


def test_replicated_final_and_all_with_everything_on():  # §11.6, §11.7
    net = mlp()
    model = poptorch.trainingModel(WithLoss(net), _options(1, 4))
    out, loss = model(*_data(8))
    assert out.shape == (8, 3) and loss.shape == (4,)
    model.destroy()
    opts = _options(2, 2, 3).outputMode(enums.OutputMode.All)
    net = mlp()
    model = poptorch.trainingModel(WithLoss(net), opts, torch.optim.SGD(net.parameters(), lr=0))
    x, y = _data(60)
    out, loss = model(x, y)
    assert out.shape == (60, 3) and loss.shape == (12,)
    # row 37: device iteration 1, accumulation step 0, replica 1, position 2
    assert torch.allclose(out[37], net(x[37:38])[0], atol=1e-6)
    model.destroy()


def test_accumulation_mean_and_sum():  # §11.8
    x = torch.randn(4, 6)
    target = torch.randn(4, 3)
    weights = {}
    for G, lr, reduction in ((1, 0.01, None), (2, 0.01, enums.ReductionType.Mean),
                             (2, 0.01, enums.ReductionType.Sum), (1, 0.02, None)):
        net = mlp()
        model = poptorch.trainingModel(WithLoss(net, torch.nn.functional.l1_loss),
                                       _options(1, 1, G, reduction),
                                       torch.optim.SGD(net.parameters(), lr=lr))
        for _ in range(10):
            model(x, target)
        weights[(G, lr, reduction)] = [p.detach().clone() for p in net.parameters()]
        model.destroy()
    for a, b in zip(weights[(1, 0.01, None)], weights[(2, 0.01, enums.ReductionType.Mean)]):
        assert torch.allclose(a, b, atol=1e-6)
    for a, b in zip(weights[(1, 0.02, None)], weights[(2, 0.01, enums.ReductionType.Sum)]):
        assert torch.allclose(a, b, atol=1e-6)


def test_running_mean_strategy_equals_post_up_to_rounding():
    results = []
    for strategy in (enums.MeanReductionStrategy.Post, enums.MeanReductionStrategy.Running):
        net = mlp()
        opts = _options(1, 2, 4)
        opts.Training.setMeanAccumulationAndReplicationReductionStrategy(strategy)
        model = poptorch.trainingModel(WithLoss(net), opts,
                                       torch.optim.SGD(net.parameters(), lr=0.1))
        model(*_data(16))
        results.append([p.detach().clone() for p in net.parameters()])
        model.destroy()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*results))


def test_no_loss_and_two_losses_fail_at_compile():
    class NoLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x, y):
            return ((self.net(x) - 0.5) ** 2).mean()

    class TwoLosses(NoLoss):
        def forward(self, x, y):
            out = self.net(x)
            return (torch.nn.functional.cross_entropy(out, y) +
                    torch.nn.functional.mse_loss(out, torch.zeros_like(out)))

    class Wrapped(NoLoss):
        def forward(self, x, y):
            out = self.net(x)
            inner = torch.nn.functional.cross_entropy(out, y)
            return poptorch.identity_loss(inner + (out ** 2).mean(), reduction="mean")

    x, y = _data(4)
    with pytest.raises(poptorch.Error, match="Couldn't find a loss in graph!"):
        poptorch.trainingModel(NoLoss())(x, y)
    with pytest.raises(poptorch.Error, match="Multiple independent losses found in graph"):
        poptorch.trainingModel(TwoLosses())(x, y)
    model = Wrapped()
    before = [p.detach().clone() for p in model.parameters()]
    poptorch.trainingModel(model)(x, y)
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_identity_loss_reductions():
    t = torch.tensor([1.0, 2.0, 3.0])
    assert poptorch.identity_loss(t, "sum") == 6 and poptorch.identity_loss(t, "mean") == 2
    assert torch.equal(poptorch.identity_loss(t, "none"), t)
    with pytest.raises(AssertionError, match="Unsupported reduction type!"):
        poptorch.identity_loss(t, "max")


def test_weights_reach_the_user_module_and_an_inference_model_sees_them():
    net = mlp()
    inference = poptorch.inferenceModel(net)
    x, y = _data(4)
    before = inference(x).clone()
    training = poptorch.trainingModel(WithLoss(net), _options(1, 2),
                                      torch.optim.SGD(net.parameters(), lr=0.5))
    training(*_data(8))
    with torch.no_grad():
        assert torch.equal(inference(x), net(x)) and not torch.equal(before, net(x))
    training.destroy()


def test_hyper_parameters_change_only_through_set_optimizer():
    net = mlp()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    model = poptorch.trainingModel(WithLoss(net), _options(), optimizer)
    x, y = _data(4)
    model(x, y)
    optimizer.param_groups[0]["lr"] = 0.0
    before = [p.detach().clone() for p in net.parameters()]
    model(x, y)  # still lr 0.1
    assert not all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    model.setOptimizer(optimizer)
    before = [p.detach().clone() for p in net.parameters()]
    model(x, y)  # lr 0 now
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    optimizer.param_groups[0]["momentum"] = 0.9  # a default: compiled as a constant
    with pytest.raises(poptorch.Error, match="'momentum' of parameter group 0 was compiled as "
                                             "a constant"):
        model.setOptimizer(optimizer)
    model.destroy()


def test_the_optimizer_state_is_the_device_state():
    net = mlp()
    optimizer = poptorch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model = poptorch.trainingModel(WithLoss(net), _options(1, 2), optimizer)
    model(*_data(4))
    state = optimizer.state_dict()
    assert len(state["ipu_state"]) == 4 and "state" in state
    with pytest.raises(RuntimeError, match="Only IPU optimizer states can be loaded"):
        optimizer.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(RuntimeError, match="Cannot load optimizer state dictionary"):
        optimizer.load_state_dict({})
    model.destroy()


def test_max_grad_norm_clips_the_global_norm():
    net = mlp()
    ref = copy.deepcopy(net)
    x, y = _data(4)
    model = poptorch.trainingModel(
        WithLoss(net), _options(),
        poptorch.optim.SGD(net.parameters(), lr=1.0, max_grad_norm=0.01))
    model(x, y)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad)
                                                 for p in ref.parameters()]))
    with torch.no_grad():
        for p in ref.parameters():
            p -= p.grad * (0.01 / norm)
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(net.parameters(),
                                                                 ref.parameters()))
    model.destroy()


def test_half_accumulators_switch_to_the_running_mean():
    net = mlp()
    optimizer = poptorch.optim.SGD(net.parameters(), lr=0.1, accum_type=torch.float16)
    model = poptorch.trainingModel(WithLoss(net), _options(1, 1, 2), optimizer)
    assert model.options.Training.meanAccumulationAndReplicationReductionStrategy == \
        enums.MeanReductionStrategy.Running
    model.destroy()
    net = mlp()
    model = poptorch.trainingModel(WithLoss(net), _options(),
                                   torch.optim.SGD(net.parameters(), lr=0.1))
    model(*_data(2))
    with pytest.raises(ValueError, match="the executable is already compiled"):
        model.setOptimizer(poptorch.optim.SGD(net.parameters(), lr=0.1,
                                              accum_type=torch.float16))
    model.destroy()


def test_unsupported_optimizer_and_amsgrad():
    net = mlp()
    with pytest.raises(AssertionError, match="Unsupported optimizer type. Types supported"):
        poptorch.trainingModel(WithLoss(net), optimizer=torch.optim.Adagrad(net.parameters()))
    with pytest.raises(ValueError, match="Only non-amsgrad"):
        poptorch.trainingModel(WithLoss(mlp()), optimizer=torch.optim.Adam(
            net.parameters(), amsgrad=True))


def test_batchnorm_statistics_need_no_broadcast_buffers_off():
    """The norm updates its running statistics itself (PopTorch's rule is for buffers the
    model's code writes: tests/test_poptorch_applications.py); each replica keeps its own."""
    class WithNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                           torch.nn.Linear(8, 3))

        def forward(self, x, y):
            out = self.net(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    for broadcast in (True, False):
        _trains_own_statistics(WithNorm(), _options(1, 2).broadcastBuffers(broadcast))


def _trains_own_statistics(model, opts):
    running = model.net[1].running_mean.clone()
    trained = poptorch.trainingModel(model, opts)
    trained(*_data(8))
    assert not torch.equal(running, model.net[1].running_mean)  # replica 0's own buffers
    trained.destroy()


def test_dropout_draws_the_same_numbers_at_every_run():
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Dropout(0.5),
                                  torch.nn.Linear(32, 3))
        opts = _options(2, 2).randomSeed(3)
        model = poptorch.trainingModel(WithLoss(net), opts,
                                       torch.optim.SGD(net.parameters(), lr=0.1))
        torch.rand(5)  # the program's own draws do not move the replicas' streams
        model(*_data(8))
        results.append([p.detach().clone() for p in net.parameters()])
        model.destroy()
    assert all(torch.equal(a, b) for a, b in zip(*results))


def _one_step(optimizer_of):
    """Weights before, gradients and weights after one training call of a linear model."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    ref = copy.deepcopy(net)
    torch.nn.functional.mse_loss(ref(x), y).backward()
    before = [p.detach().clone() for p in net.parameters()]
    model = poptorch.trainingModel(WithLoss(net, torch.nn.functional.mse_loss),
                                   optimizer=optimizer_of(net.parameters()))
    model(x, y)
    model.destroy()
    return before, [p.grad for p in ref.parameters()], list(net.parameters())


def test_adamw_without_bias_correction_and_rmsprop_tf_variant():
    lr, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-8
    before, grads, after = _one_step(lambda p: poptorch.optim.AdamW(
        p, lr=lr, weight_decay=wd, bias_correction=False))
    for w, g, new in zip(before, grads, after):
        m, v = (1 - b1) * g, (1 - b2) * g * g
        assert torch.allclose(new, w * (1 - lr * wd) - lr * m / (v.sqrt() + eps), atol=1e-6)
    alpha = 0.99
    before, grads, after = _one_step(lambda p: poptorch.optim.RMSprop(
        p, lr=lr, alpha=alpha, eps=eps, use_tf_variant=True))
    for w, g, new in zip(before, grads, after):
        square = alpha + (1 - alpha) * g * g  # the TF variant starts from ones
        assert torch.allclose(new, w - lr * g / (square + eps).sqrt(), atol=1e-6)
