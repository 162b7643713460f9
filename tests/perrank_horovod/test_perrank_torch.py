"""collectives.horovod on torch tensors, as horovod.torch takes them, run by every rank of a
job at once (see test_perrank_horovod.py): results are tensors of the inputs' dtype, shape
and device; parameters and optimizer state are broadcast in place; DistributedOptimizer
averages the gradients in step(). Each rank's data is a known function of its rank, so the
oracles are computed locally with plain torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import collectives.horovod as hvd


def test_allreduce_of_a_tensor_is_a_tensor_of_its_dtype_shape_and_device():
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64):
        x = torch.full((2, 3), r + 1, dtype=dtype)
        out = hvd.allreduce(x, op=hvd.Sum)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype
        assert out.shape == x.shape and out.device == x.device
        assert torch.equal(out, torch.full((2, 3), n * (n + 1) // 2, dtype=dtype))
    mean = hvd.allreduce(torch.tensor(float(r)))          # 0-d, op None: Average
    assert mean.shape == () and mean.item() == pytest.approx((n - 1) / 2)
    x = torch.arange(6.0).reshape(2, 3).t()               # not contiguous
    assert torch.equal(hvd.allreduce(x, op=hvd.Max), x)
    assert x.is_contiguous() is False                      # the input is not touched


def test_grouped_allreduce_of_metrics_as_graphcores_examples_write_it():
    n, r = hvd.size(), hvd.rank()
    losses, accuracies = torch.tensor([r, r + 1.0]), torch.tensor([0.5, float(r)])
    loss, accuracy = hvd.grouped_allreduce([torch.mean(losses), torch.mean(accuracies)],
                                           op=hvd.Average)
    assert loss.shape == () and accuracy.shape == ()
    assert loss.item() == pytest.approx(np.mean([q + 0.5 for q in range(n)]))
    sizes = hvd.grouped_allreduce([torch.tensor(10 * (q + 1)) for q in range(2)], op=hvd.Sum)
    assert [t.item() for t in sizes] == [10 * n, 20 * n] and sizes[0].dtype == torch.int64
    slowest = torch.max(hvd.allgather(torch.tensor([float(r)]))).item()
    assert slowest == n - 1


def test_broadcast_and_allgather_keep_the_tensor_type_bfloat16_included():
    n, r = hvd.size(), hvd.rank()
    seed = hvd.broadcast(torch.tensor(1234 + r), root_rank=0)
    assert seed.shape == () and seed.item() == 1234
    b = hvd.broadcast(torch.full((3,), r, dtype=torch.bfloat16), root_rank=n - 1)
    assert b.dtype == torch.bfloat16 and b.tolist() == [n - 1] * 3
    g = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.bfloat16))
    assert g.dtype == torch.bfloat16 and g.shape == (n * (n + 1) // 2, 2)
    with pytest.raises(TypeError, match="bfloat16 tensors cannot be reduced"):
        hvd.allreduce(torch.ones(2, dtype=torch.bfloat16))
    x = torch.zeros(3)
    assert hvd.broadcast_(x.add_(r), root_rank=0) is x and x.tolist() == [0.0] * 3


def test_in_place_allreduce_of_a_parameter():
    n, r = hvd.size(), hvd.rank()
    p = torch.nn.Parameter(torch.full((4,), float(r)))
    assert hvd.allreduce_(p, op=hvd.Sum) is p
    assert p.requires_grad and p.tolist() == [float(sum(range(n)))] * 4


def test_gradients_flow_through_allreduce_allgather_and_broadcast():
    n, r = hvd.size(), hvd.rank()
    x = torch.full((3,), r + 1.0, requires_grad=True)
    y = hvd.allreduce(x * 2, op=hvd.Sum)
    y.sum().backward()
    assert y.requires_grad and x.grad.tolist() == [2.0 * n] * 3   # horovod.torch's
    x.grad = None
    hvd.allgather(x.unsqueeze(0)).sum().backward()                # averaged, this row
    assert x.grad.tolist() == [1.0] * 3
    x.grad = None
    hvd.broadcast(x, root_rank=0).sum().backward()                # zero off the root
    assert x.grad.tolist() == ([1.0] * 3 if r == 0 else [0.0] * 3)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_broadcast_parameters_of_a_state_dict_and_of_named_parameters_in_place():
    n, r = hvd.size(), hvd.rank()
    model = _model(seed=100 + r)                   # every rank starts elsewhere
    model(torch.randn(5, 4))                       # BatchNorm buffers move too
    weight = model[0].weight                       # the same tensor after the broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    root = hvd.broadcast_object({k: v for k, v in model.state_dict().items()}, root_rank=0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, root[k]), k
    assert model[0].weight is weight and weight.requires_grad
    other = _model(seed=200 + r)
    hvd.broadcast_parameters(list(other.named_parameters()), root_rank=n - 1)
    hvd.broadcast_parameters(list(other.parameters()), root_rank=n - 1)
    gathered = hvd.allgather_object([p.detach() for p in other.parameters()])
    assert all(torch.equal(a, b) for ranks in zip(*gathered) for a, b in zip(ranks, ranks[1:]))
    with pytest.raises(ValueError, match="invalid params of type"):
        hvd.broadcast_parameters(other.named_parameters(), root_rank=0)   # a generator


def _data(q: int):
    g = torch.Generator().manual_seed(q)
    return torch.randn(6, 4, generator=g), torch.randint(0, 2, (6,), generator=g)


def _grads(model, x, y):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_distributed_optimizer_reduces_the_gradients_in_step(op):
    n, r = hvd.size(), hvd.rank()
    model = _model(seed=7).eval()
    reference = _model(seed=7).eval()
    per_rank = [_grads(reference, *_data(q)) for q in range(n)]
    want = [sum(gs[i] for gs in per_rank) / (n if op == "Average" else 1)
            for i in range(len(per_rank[0]))]
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), op=op)
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(_data(r)[0]), _data(r)[1]).backward()
    opt.step()
    for p, b, g in zip(model.parameters(), before, want):
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(p.detach(), b - 0.1 * g, rtol=1e-6, atol=1e-7)


def test_distributed_optimizer_passes_skip_synchronize_and_horovods_errors():
    n, r = hvd.size(), hvd.rank()
    model = _model(seed=8).eval()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2,
                                   compression=hvd.Compression.fp16)
    x, y = _data(r)
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()
    grads = hvd.allgather_object([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for ranks in zip(*grads) for a, b in zip(ranks, ranks[1:]))
    opt.zero_grad()
    if n > 1:   # Horovod registers its hooks only with several ranks
        with pytest.raises(AssertionError, match="Gradients were computed more than "
                                                 "backward_passes_per_step times"):
            for _ in range(3):
                torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with pytest.raises(AssertionError, match="optimizer.zero_grad\\(\\) was called after "
                                                 "loss.backward\\(\\)"):
            opt.zero_grad()
        with pytest.warns(UserWarning, match="optimizer.step\\(\\) called without "
                                             "optimizer.skip_synchronize\\(\\) context"):
            opt.step()   # (after the explicit synchronize above: Horovod's warning)
    with pytest.raises(ValueError, match="Parameter names in named_parameters must be unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("w", p) for p in model.parameters()])
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported with "
                                         "op != Average"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1 + 0.01 * hvd.rank(), momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.01 * (hvd.rank() + 1), betas=(0.8, 0.99)),
], ids=["sgd-momentum", "adam"])
def test_broadcast_optimizer_state_gives_every_rank_the_roots(make):
    n, r = hvd.size(), hvd.rank()
    model = _model(seed=9)
    opt = make(model.parameters())
    if r == 0:   # the root has state from real steps; the others start fresh
        for _ in range(2):
            _grads(model, *_data(0))
            opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    mine = opt.state_dict()
    root = hvd.broadcast_object(mine, root_rank=0)
    assert mine["param_groups"] == root["param_groups"]
    for pid, state in root["state"].items():
        for key, value in state.items():
            got = mine["state"][pid][key]
            assert torch.equal(got, value) if torch.is_tensor(value) else got == value


def test_objects_with_tensors_travel_without_pickle():
    n, r = hvd.size(), hvd.rank()
    got = hvd.allgather_object({"rank": torch.tensor(r), "w": torch.full((2,), float(r))})
    assert [g["rank"].item() for g in got] == list(range(n))
    assert got[n - 1]["w"].tolist() == [n - 1.0] * 2
