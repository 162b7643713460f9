"""The per-operation compute model (collectives.performance.compute_model) against hand
counts, and the ATen operations PopTorch's ledger records (issue 30, items 1 and 6)."""

from __future__ import annotations

import math

import pytest

from collectives.performance.compute_model import (
    AMP_WARMUP_CYCLES, AMP_WEIGHT_LOAD_BYTES_PER_CYCLE, EXCHANGE_BYTES_PER_CYCLE, SYNC_CYCLES,
    VECTOR_BYTES_PER_CYCLE, VERTEX_OVERHEAD_CYCLES, ComputeProfile, OpRecord, amp_groups,
    amp_macs_per_cycle, amp_time, op_time, vector_time)
from ipu_node.chips import BOW, GC200

HZ = GC200.clock_hz


def test_amp_figures_come_from_the_datasheet_peaks():
    assert amp_macs_per_cycle(GC200, "float16") == 64   # 249.7 TFLOPS / (2 x 1472 x 1.33 GHz)
    assert amp_macs_per_cycle(GC200, "float32") == 16
    assert amp_macs_per_cycle(BOW, "float16") == 64     # 350 TFLOPS at 1.85 GHz
    assert amp_groups(GC200, "float16") == (16, 16, 4)  # 4 halves a load x depth 4; 64 / 4
    assert amp_groups(GC200, "float32") == (8, 8, 4)


def test_a_one_tile_matmul_by_hand():
    # [16, 16] x [16, 16] in float16: one weight block, 16 positions; the best split is no
    # split (one tile): warm-up + weights (16 x 16 halves at 8 B/cycle) + 16 x 4 cycles,
    # the operands' 16 x 16 + 16 x 16 halves received at 4 B/cycle, one sync
    t = amp_time(GC200, "float16", m=16, k=16, n=16)
    amp = AMP_WARMUP_CYCLES + 16 * 16 * 2 / AMP_WEIGHT_LOAD_BYTES_PER_CYCLE + 16 * 4
    exchange = (16 * 16 + 16 * 16) * 2 / EXCHANGE_BYTES_PER_CYCLE
    # splitting the 16 positions over tiles trades AMP cycles for nothing else here: the
    # model takes the cheapest split, never more than the one-tile plan
    assert t.amp + t.exchange <= (amp + exchange) / HZ + 1e-15
    assert t.sync == SYNC_CYCLES / HZ and t.vector == 0.0
    # 1024 x 16 positions (the planner splits by powers of two): 16 on each of 1024 tiles
    m16 = amp_time(GC200, "float16", m=16 * 1024, k=16, n=16)
    assert m16.amp == pytest.approx(amp / HZ)
    assert m16.exchange == pytest.approx(exchange / HZ)


def test_matmul_padding_and_shape_efficiency():
    big = amp_time(GC200, "float16", m=4096, k=1024, n=4096)
    ideal = 2 * 4096 * 1024 * 4096 / GC200.peak_flops("float16")
    assert ideal < big.total < 4 * ideal   # near peak, but not at it
    # K = 17 pads to two input-channel groups: about twice K = 16's AMP time
    k16 = amp_time(GC200, "float16", m=1472 * 64, k=16, n=16)
    k17 = amp_time(GC200, "float16", m=1472 * 64, k=17, n=16)
    assert k17.amp == pytest.approx(2 * k16.amp, rel=0.05)
    # a tiny matmul is dominated by sync and exchange
    tiny = amp_time(GC200, "float16", m=8, k=8, n=8)
    assert tiny.sync + tiny.exchange > tiny.amp
    assert amp_time(GC200, "float32", m=4096, k=1024, n=4096).total > big.total
    with pytest.raises(ValueError, match="dimensions must be >= 1"):
        amp_time(GC200, "float16", m=0, k=1, n=1)


def test_a_convolution_is_its_implicit_matmul_with_kernel_blocks():
    # ResNet-50's 3x3 conv of 64 channels at 56x56, batch 20: M = 20 x 56 x 56, K = 64 x 9
    conv = op_time(GC200, OpRecord("convolution", "conv", "float16", (1, 20 * 56 * 56, 64, 9,
                                                                       64)))
    as_mm = amp_time(GC200, "float16", m=20 * 56 * 56, k=64, n=64, kernel=9)
    assert conv == as_mm
    # the first layer's 3 input channels fill 3 of an AMP group's 16
    first = amp_time(GC200, "float16", m=20 * 112 * 112, k=3, n=64, kernel=49)
    full = amp_time(GC200, "float16", m=20 * 112 * 112, k=16, n=64, kernel=49)
    assert first.amp == pytest.approx(full.amp)


def test_an_elementwise_op_by_its_bytes():
    # a float16 add of two [20, 64, 112, 112] tensors: reads 2, writes 1
    n = 20 * 64 * 112 * 112
    nbytes = 3 * n * 2
    t = vector_time(GC200, "elementwise", nbytes)
    per_tile = nbytes / 1472
    assert t.vector == pytest.approx((VERTEX_OVERHEAD_CYCLES + per_tile
                                      / VECTOR_BYTES_PER_CYCLE) / HZ)
    assert t.sync == SYNC_CYCLES / HZ and t.exchange == 0 and t.amp == 0
    assert vector_time(GC200, "normalisation", nbytes).sync == 2 * SYNC_CYCLES / HZ
    assert vector_time(GC200, "data movement", nbytes).exchange > 0
    assert vector_time(GC200, "view", nbytes).total == 0
    # an op priced at float16 that ran in float32 moves half the bytes
    rec = OpRecord("add", "elementwise", "float32", (), 4 * 3 * n)
    assert op_time(GC200, rec, dtype="float16") == t


def test_profile_prices_adds_and_round_trips():
    a = OpRecord("mm", "matmul", "float16", (1, 256, 256, 256), 3 * 256 * 256 * 2, 2 * 256 ** 3)
    b = OpRecord("relu", "elementwise", "float16", (), 2 * 256 * 256 * 2)
    p = ComputeProfile.of([a, b, b])
    priced = p.price(GC200)
    assert priced.total_s == pytest.approx(op_time(GC200, a).total + 2 * op_time(GC200, b).total)
    assert priced.by_kind["element-wise"] == pytest.approx(2 * op_time(GC200, b).total)
    assert priced.flops == 2 * 256 ** 3
    assert math.isclose(sum(priced.by_category.values()), priced.total_s)
    assert {t[0] for t in priced.top} == {"mm", "relu"}
    assert ComputeProfile.from_plain(p.to_plain()) == p
    assert (p + p).price(GC200).total_s == pytest.approx(2 * priced.total_s)
    syncs = priced.by_category["sync"]
    assert p.price(GC200, scale=3).total_s == pytest.approx(3 * (priced.total_s - syncs) + syncs)
    assert p.price(GC200, scale=3).by_category["sync"] == pytest.approx(syncs)
    with pytest.raises(ValueError, match="compute profile is a list"):
        ComputeProfile.from_plain([["mm"]])
    with pytest.raises(ValueError, match="kind must be one of"):
        OpRecord("mm", "gemm")


def test_the_ledger_records_pytorch_operations():
    torch = pytest.importorskip("torch")
    from poptorch.modelling._op_ledger import OpLedger
    from poptorch.modelling._profile import FlopCount

    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(2, 3, 5, 5)
    ledger, counter = OpLedger(), FlopCount()
    with ledger, counter:
        y = torch.relu(conv(x)).mean(dim=(2, 3))
        lin(y).sum().backward()
    kinds = {(r.name, r.kind) for r in ledger.records}
    assert ("convolution", "conv") in kinds and ("addmm", "matmul") in kinds
    assert ("relu", "elementwise") in kinds and ("mean", "reduction") in kinds
    assert ("convolution_backward (weight)", "matmul") in kinds
    c = next(r for r in ledger.records if r.name == "convolution")
    assert c.dims == (1, 2 * 5 * 5, 3, 9, 8) and c.flops == 2 * 2 * 25 * 8 * 27
    mm = next(r for r in ledger.records if r.name == "addmm")
    assert mm.dims == (1, 2, 8, 4) and mm.nbytes == (4 + 2 * 8 + 8 * 4 + 2 * 4) * 4
    # the ledger sees what the counter runs: the same FLOPs
    assert sum(r.flops for r in ledger.records) == counter.total


def test_the_ledger_records_the_channels_of_a_batch_norm_in_training():
    """A batch norm computing statistics over its batch (forward and backward in training)
    carries its channels, for a distributed batch norm's all-reduce; in evaluation, with
    running statistics, and other normalisations, it carries none."""
    torch = pytest.importorskip("torch")
    from poptorch.modelling._op_ledger import OpLedger

    bn, ln = torch.nn.BatchNorm2d(6), torch.nn.LayerNorm(5)
    x = torch.randn(4, 6, 5, 5, requires_grad=True)
    with OpLedger() as ledger:
        ln(bn(x)).sum().backward()
    norms = [r for r in ledger.records if r.kind == "normalisation"]
    batch = [r for r in norms if "batch_norm" in r.name]
    assert len(batch) == 2 and all(r.dims == (6,) for r in batch)  # forward and backward
    assert all(r.dims == () for r in norms if "layer_norm" in r.name)
    bn.eval()
    with OpLedger() as ledger, torch.no_grad():
        bn(x)
    assert [r.dims for r in ledger.records if r.kind == "normalisation"] == [()]
