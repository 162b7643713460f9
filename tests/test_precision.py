"""Float16 programs computed in float32 and rounded to float16 (poptorch.execution._precision,
issue 30 item 3)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import poptorch  # noqa: E402
from poptorch.execution._precision import (PARTIALS_CHUNK, HalfAsFloat, matmul_half_partials,  # noqa: E402
                                 precision_mode)


def test_each_float16_op_is_float32_rounded_to_float16():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 64, generator=g).half()
    b = torch.randn(64, 8, generator=g).half()
    with HalfAsFloat():
        c = a @ b
        d = torch.nn.functional.gelu(c)
    assert c.dtype == torch.float16 and torch.equal(c, (a.float() @ b.float()).half())
    assert torch.equal(d, torch.nn.functional.gelu(c.float()).half())
    p = torch.ones(4).half()
    third = torch.full((4,), 1 / 3).half()
    with HalfAsFloat():
        p.add_(third)  # in place: the float32 sum rounded into the float16 tensor
    assert p.dtype == torch.float16 and torch.equal(p, (1 + third.float()).half())
    x = torch.randn(3, 5)
    with HalfAsFloat():
        assert torch.equal(x * 2, x * 2)  # float32 programs untouched


def test_half_partials_round_every_amp_group():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 4 * PARTIALS_CHUNK, generator=g).half()
    b = torch.randn(4 * PARTIALS_CHUNK, 8, generator=g).half()
    with HalfAsFloat("half"):
        half = a @ b
    chunks = [(a[:, i:i + PARTIALS_CHUNK].float() @ b[i:i + PARTIALS_CHUNK].float()).half()
              for i in range(0, a.shape[1], PARTIALS_CHUNK)]
    total = chunks[0]
    for c in chunks[1:]:
        total = (total.float() + c.float()).half()
    assert torch.equal(half, total)
    assert torch.equal(matmul_half_partials(a.float(), b.float()), total)
    with HalfAsFloat("float"):
        once = a @ b
    assert not torch.equal(once, half)  # the partials type changes the rounding
    with pytest.raises(ValueError, match="partials must be"):
        HalfAsFloat("double")
    assert not isinstance(precision_mode([torch.ones(2)]), HalfAsFloat)
    assert isinstance(precision_mode([torch.ones(2).half()], "half"), HalfAsFloat)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 10)

    def forward(self, x, y):
        out = self.b(torch.relu(self.a(x)))
        return out, torch.nn.functional.cross_entropy(out.float(), y)


def test_a_half_poptorch_model_trains_in_float32_counted_at_float16():
    torch.manual_seed(0)
    net = _Net()
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    n32, h = copy.deepcopy(net), copy.deepcopy(net).half()
    m32 = poptorch.trainingModel(n32, poptorch.Options(), torch.optim.SGD(n32.parameters(),
                                                                          lr=0.1))
    m16 = poptorch.trainingModel(h, poptorch.Options(), torch.optim.SGD(h.parameters(), lr=0.1))
    o32, l32 = m32(x, y)
    o16, l16 = m16(x.half(), y)
    assert o16.dtype == torch.float16 and h.a.weight.dtype == torch.float16
    assert l16.item() == pytest.approx(l32.item(), rel=1e-2)
    report = m16.modelReport()
    params = sum(p.numel() for p in h.parameters())
    assert next(iter(report.memory.values()))["parameters"] == 2 * params  # float16 bytes
    card = report.card_fields()
    assert card["grad_dtype"] == "float16"
    dtypes = {op[2] for op in card["compute_ops"][0] if op[1] in ("matmul", "conv")}
    assert dtypes == {"float16"}  # priced at the float16 peak
    for m in (m32, m16):
        m.destroy()


class _Reference(torch.utils._python_dispatch.TorchDispatchMode):
    """The rule spelt out plainly: every op with a float16 operand runs on ``.float()``
    copies and its float16 results are its float32 results rounded; views and casts as
    they are; an in-place op's result copied into the float16 tensor it wrote."""

    _as_is = {"_to_copy", "copy_", "detach", "empty_like", "zeros_like", "ones_like",
              "full_like", "clone"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name.split("::")[1] in self._as_is or func.is_view:
            return func(*args, **kwargs)
        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        if not any(isinstance(t, torch.Tensor) and t.dtype == torch.float16 for t in flat):
            return func(*args, **kwargs)
        up = [t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float16 else
              torch.float32 if t is torch.float16 else t for t in flat]
        up_args, up_kwargs = torch.utils._pytree.tree_unflatten(up, spec)
        out = func(*up_args, **up_kwargs)
        written = {}
        if func is torch.ops.aten.native_batch_norm.default or any(
                a.alias_info is not None and a.alias_info.is_write
                for a in func._schema.arguments):  # (batch norm's running statistics)
            for orig, new in zip(args, up_args):
                if isinstance(orig, torch.Tensor) and orig is not new:
                    orig.copy_(new)
                    written[id(new)] = orig
        # a result that is a written operand is that operand; new results are rounded
        return torch.utils._pytree.tree_map(
            lambda t: written[id(t)] if id(t) in written else
            t.half() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t, out)


class _Block(torch.nn.Module):
    """Views of one projection (q, k, v), a transpose, a norm, an in-place op, ops whose
    float32 results are float16 values."""

    def __init__(self):
        super().__init__()
        self.proj, self.norm = torch.nn.Linear(32, 96), torch.nn.LayerNorm(32)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x, y):
        q, k, v = self.proj(x).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / 32 ** 0.5, dim=-1) @ v
        h = self.norm(att + x)
        h = h.relu_()
        h = torch.relu(h - 0.5) + torch.maximum(-h, h.abs() - 1)  # (float32 results kept)
        out = self.head(h[:, 0])
        return out, torch.nn.functional.cross_entropy(out.float(), y)


class _ConvBlock(torch.nn.Module):
    """A convolution with a bias after a batch norm: batch norm writes its running
    statistics in place and returns new tensors (its output and the saved statistics)."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = torch.nn.Conv2d(3, 16, 3, bias=False), torch.nn.BatchNorm2d(16)
        self.c2, self.head = torch.nn.Conv2d(16, 8, 3), torch.nn.Linear(8, 10)

    def forward(self, x, y):
        h = self.c2(torch.relu(self.bn(self.c1(x))))
        out = self.head(h.mean(dim=(2, 3)))
        return out, torch.nn.functional.cross_entropy(out.float(), y)


def test_an_op_that_writes_operands_returns_its_new_results_in_float16():
    bn = torch.nn.BatchNorm2d(4).half()
    x = torch.randn(2, 4, 3, 3).half()
    with HalfAsFloat():
        out = bn(x)
    assert out.dtype == torch.float16  # it was float32: batch norm writes running_mean
    ref = torch.nn.functional.batch_norm(x.float(), torch.zeros(4), torch.ones(4),
                                         training=True, momentum=0.1)
    assert torch.equal(out, ref.half())
    assert bn.running_mean.dtype == torch.float16 and bn.running_mean.abs().sum() > 0


@pytest.mark.parametrize("block,shape", [(_Block, (4, 6, 32)), (_ConvBlock, (4, 3, 8, 8))])
def test_kept_float32_copies_give_the_plain_rules_bits(block, shape):
    """Forward, backward and two optimizer steps (momentum) under :class:`HalfAsFloat`, whose
    float32 copies are kept across ops, equal bit for bit the plain rule's."""
    torch.manual_seed(0)
    net = block().half()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(*shape, generator=g).half(), torch.randint(0, 10, (4,), generator=g)
    results = []
    for mode in (HalfAsFloat, _Reference):
        model = copy.deepcopy(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with mode():
            for _ in range(2):
                opt.zero_grad()
                out, loss = model(x, y)
                loss.backward()
                grads = [p.grad.clone() for p in model.parameters()]
                opt.step()
        results.append((out, loss, grads, [p.detach().clone() for p in model.parameters()]
                        + [b.clone() for b in model.buffers() if b.is_floating_point()]))
    (out, loss, grads, params), (r_out, r_loss, r_grads, r_params) = results
    assert out.dtype == torch.float16 and torch.equal(out, r_out) and torch.equal(loss, r_loss)
    assert len(params) == len(r_params)
    for a, b in zip(grads + params, r_grads + r_params):
        assert a.dtype == torch.float16 and torch.equal(a, b)


@pytest.mark.parametrize("partials", [None, torch.half])
def test_a_half_conv_net_is_priced_in_float16_alike_by_its_clock_and_its_card(partials):
    """Through the compile path every convolution and matmul of a ``.half()`` conv net with
    batch norms is recorded as float16 (each by hand: its implicit matmul at the float16
    AMP's rate, the element-wise ops' bytes at 2 a element), and the model report's modelled
    compute and the ModelCard's agree: both price each op at its recorded dtype, with the
    partials type ``Precision.setPartialsType`` set."""
    from collectives.performance.compute_model import OpRecord, amp_time, op_time
    from collectives.step_model import ModelCard, StepConfig, predict
    from ipu_node.chips import GC200

    torch.manual_seed(0)
    net = _ConvBlock().half()
    opts = poptorch.Options()
    if partials is not None:
        opts.Precision.setPartialsType(partials)
    model = poptorch.trainingModel(net, opts, torch.optim.SGD(net.parameters(), lr=0.1))
    x, y = torch.randn(4, 3, 8, 8).half(), torch.randint(0, 10, (4,))
    model.compile(x, y)
    want = "float16" if partials is torch.half else "float32"
    stage = model._profile.stages[0]
    ops = stage.forward_ops + stage.backward_ops
    amp = [(r, c) for r, c in ops.ops if r.kind in ("matmul", "conv")]
    # forward: 2 convolutions, addmm; backward: c2's input and weight gradients, c1's weight
    # gradient (its input needs none), the head's 2 mm
    assert len(amp) == 8 and {r.dtype for r, _ in amp} == {"float16"}
    # c1: 4 x 6 x 6 positions, 3 input channels, 3 x 3 kernel, 16 output channels
    c1 = next(r for r, _ in amp if r.name == "convolution" and r.dims[4] == 16)
    assert c1.dims == (1, 4 * 36, 3, 9, 16)
    assert c1.nbytes == 2 * (4 * 3 * 64 + 16 * 27 + 4 * 16 * 36)  # float16 operands
    assert op_time(GC200, c1, partials=want) == amp_time(GC200, "float16", m=144, k=3, n=16,
                                                          kernel=9, partials=want)
    relu = next(r for r, _ in ops.ops if r.name == "relu")
    assert relu == OpRecord("relu", "elementwise", "float16", (), 2 * 2 * 4 * 16 * 36)
    report = model.modelReport()
    card = ModelCard.from_run(run=report)
    assert card.partials == model._profile.partials == want
    clock = model._clock
    est = predict(card, StepConfig("POD16", 1, micro_batch=4, gradient_accumulation=1))
    assert est.breakdown["compute"] == pytest.approx(clock.forward_s[0] + clock.backward_s[0])
    assert clock.forward_s[0] + clock.backward_s[0] == pytest.approx(
        ops.price(GC200, partials=want).total_s)
    # float32 only where the program asks for it, the loss of out.float(), and batch norm's
    # int64 num_batches_tracked += 1 (ops on no float tensor count as float32)
    assert {r.name for r, _ in ops.ops if r.dtype == "float32" and r.kind != "view"} <= {
        "_to_copy", "_log_softmax", "nll_loss_forward", "nll_loss_backward",
        "_log_softmax_backward_data", "ones_like", "div", "expand", "clone", "add_"}
    model.destroy()
