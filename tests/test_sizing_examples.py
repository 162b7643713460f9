"""The sizing examples (examples/size_resnet50.py, size_bert_large.py, size_bert_poptorch.py)
print the tables."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_resnet50_inputs_and_tables(capsys):
    r50 = load("size_resnet50")
    assert r50.CARD.params == 25_557_032 and r50.CARD.grad_dtype == "float16"
    assert r50.CARD.input_bytes_per_item == 150_528
    assert r50.CONFIGS == (("POD16", 16, 10, 8), ("POD64", 64, 3, 32), ("POD128", 128, 2, 64),
                           ("POD256", 256, 2, 128))
    assert r50.main(["--systems", "POD16,POD64"]) == 0
    out = capsys.readouterr().out
    assert out.count("samples/s") == 2 and "POD64 (GC200): 64 replicas" in out
    assert "assumption: compute at 0.5" in out
    # the ladder's periphery, both rings of the quad ring (the 2D schedules pay for smaller
    # tensors, tests/test_cost_model_properties.py)
    assert "all-reduce schedule: quad_directional_ring" in out


def test_bert_large_inputs():
    bert = load("size_bert_large")
    assert bert.CARD.params == 335_141_888 and bert.CARD.samples_per_item == 2
    assert bert.CARD.optimizer_state_in == "streaming"
    assert bert.CONFIGS == (("POD16", 4, 4, 192, 1), ("POD64", 8, 8, 96, 1),
                            ("POD128", 16, 8, 96, 2))


@pytest.mark.slow  # runs a (tiny) PopTorch training job
def test_bert_poptorch_sizes_the_model_from_its_run(capsys):
    sizer = load("size_bert_poptorch")
    assert sizer.main(["--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16",
                       "--vocab", "64", "--ipus", "2", "--gradient-accumulation", "3",
                       "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "PipelinedExecution, 2 stage(s) on 2 IPU(s)" in out
    for system in sizer.SYSTEMS:
        assert f"{system} (" in out  # every POD's breakdown table
    assert out.count("samples/s:") == len(sizer.SYSTEMS)
    assert out.count("  IPU ") >= 4 and "code and exchange" in out
    assert "model card from the run: ModelCard(params=" in out


@pytest.mark.slow  # compiles ResNet-50 (a small image) and a 4-layer BERT-Large in PopTorch
@pytest.mark.parametrize("model,extra", [
    ("resnet50", ["--micro-batch", "2", "--image-size", "32"]),
    ("bert-large", ["--micro-batch", "2", "--layers", "4"]),
])
def test_published_configurations_side_by_side(model, extra, capsys):
    sized = load("size_published")
    assert sized.main([model, *extra]) == 0
    out = capsys.readouterr().out
    for label, system, replicas, ipus, accumulation, published, source in \
            sized.PUBLISHED[model]:
        line = next(line for line in out.splitlines() if line.startswith(label))
        predicted = float(line.split()[-len(source.split()) - 3].replace(",", ""))
        ratio = float(line.split()[-len(source.split()) - 1])
        assert f"{published:,}" in line and source in line
        assert ratio == pytest.approx(predicted / published, abs=0.006)
    assert "compute by operation: matmul/conv" in out and "top operations:" in out
    assert "compute per operation on the" in out
    assert ("resnet50 POD64/POD256" in out) == (model == "resnet50")


def test_mlperf_v11_ratios_of_time_to_train(capsys):
    """The five ratios of MLPerf Training v1.1 time to train between POD sizes, beside the
    step model's: the sizing examples' configurations are the result logs' ones, and the
    time to train is the data each run trained on (the logs': epochs of ImageNet, BERT
    samples) over the predicted samples/s."""
    mlperf, r50, bert = load("mlperf_v11"), load("size_resnet50"), load("size_bert_large")
    assert [(p.system, p.replicas, p.gradient_accumulation) for p in mlperf.RESNET50.values()
            ] == [c[:3] for c in r50.CONFIGS]
    assert [(p.system, p.replicas, p.ipus_per_replica, p.gradient_accumulation)
            for p in mlperf.BERT_LARGE.values()] == [c[:4] for c in bert.CONFIGS]
    rates = mlperf.predicted_rates({"resnet50": r50.CARD, "bert-large": bert.CARD})
    rows = {(m, a, b): (pub, pred, thr) for m, a, b, pub, pred, thr in mlperf.ratios(rates)}
    pub, pred, thr = rows[("resnet50", "POD64", "POD256")]
    assert pub == pytest.approx(8.502 / 3.792)
    assert pred == pytest.approx((38 / rates[("resnet50", "POD64")])
                                 / (45 / rates[("resnet50", "POD256")]))
    assert thr == pytest.approx(rates[("resnet50", "POD256")] / rates[("resnet50", "POD64")])
    held = {k for k, (pub, pred, _) in rows.items() if abs(pred / pub - 1) <= 0.15}
    # ResNet-50 POD64/POD128 at 1.15 (1.153 since each micro-batch's input stream copy is
    # priced, GA 3 against 2; 1.149 before) and POD64/POD256 at 1.39 miss: the logs' host-side
    # time (about 60 s a run at every size) and a per-step cost beyond one POD64 are unpriced
    assert held >= {("resnet50", "POD16", "POD64"), ("bert-large", "POD16", "POD64"),
                    ("bert-large", "POD64", "POD128")}
    # from throughput alone (as if every size trained on the same data) fewer hold
    assert sum(abs(thr / pub - 1) <= 0.15 for pub, _, thr in rows.values()) < len(held)
    # the host-side seconds of the published times (checkpoints, evaluations, start-up),
    # taken as the logs give them: with them every ratio holds
    assert mlperf.RESNET50["POD256"].host_side_s == pytest.approx(
        3.792 * 60 - 45 * 1_281_167 / 351_005)
    host = {(m, a, b): pred / pub
            for m, a, b, pub, pred, _ in mlperf.ratios_with_host_side(rates)}
    p64, p256 = mlperf.RESNET50["POD64"], mlperf.RESNET50["POD256"]
    assert host[("resnet50", "POD64", "POD256")] * 8.502 / 3.792 == pytest.approx(
        (p64.items / rates[("resnet50", "POD64")] + p64.host_side_s)
        / (p256.items / rates[("resnet50", "POD256")] + p256.host_side_s))
    assert all(abs(r - 1) <= 0.15 for r in host.values())
    assert mlperf.main([]) == 0
    out = capsys.readouterr().out
    assert "resnet50 POD64/POD256" in out and "bert-large POD64/POD128" in out
    assert "host-side seconds" in out


def _forward_flops_counted_by_torch(build, inputs) -> int:
    """The forward FLOPs of ``build()`` on ``inputs()`` as PyTorch's own FlopCounterMode counts
    them, on fake tensors (shapes only, no kernel runs; in float32: the count does not
    depend on the dtype): the hand count of a full-size model."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    args = inputs()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build()
        with FlopCounterMode(display=False) as counter:
            model(*args)
    return counter.get_total_flops()


@pytest.mark.slow  # ResNet-50 at its published micro-batch (20, 224 x 224), one pass on the CPU
def test_resnet50_at_its_published_configuration():
    """Graphcore's MLPerf layout (seven pieces on one IPU, recomputed, micro-batch 20, 8-bit
    input) compiles, fits one IPU, counts the FLOPs PyTorch's counter counts, and predicts
    IPU-POD16's MLPerf v1.0 and v1.1 throughputs within 25%."""
    import torch
    from collectives.step_model import ModelCard, StepConfig, predict

    sized = load("size_published")
    training, inputs = sized._resnet(20, 224, accumulation=10)
    training.compile(*inputs)
    report = training.modelReport()
    assert len(report.stages) == len(sized.RESNET_PIECES) + 1
    assert {s.ipu for s in report.stages} == {0}
    assert all(s.recompute_flops == s.forward_flops for s in report.stages[:-1])
    memory = next(iter(report.memory.values()))
    assert memory["total"] <= 940_572_672  # one GC200's In-Processor-Memory, as compiled
    want = _forward_flops_counted_by_torch(
        lambda: sized.resnet50(),
        lambda: (torch.empty(20, 3, 224, 224),
                 torch.zeros(20, dtype=torch.long)))
    assert sum(s.forward_flops for s in report.stages) == want
    card = ModelCard.from_run(run=report)
    assert card.params == 25_557_032 and card.compute_micro_batch == 20
    # float16 through the compile path (batch norms included), half partials as published
    assert card.partials == "float16" and {r.dtype for ops in card.compute_ops
                                           for r, _ in ops.ops
                                           if r.kind in ("matmul", "conv")} == {"float16"}
    # the model's clock and its card price the same compute; the clock also brings each
    # micro-batch's 3 MB of input (uint8 images, int64 labels) over the IPU's PCIe link
    assert card.input_bytes_per_item == 3 * 224 * 224 + 8
    one = predict(card, StepConfig("POD16", 1, micro_batch=20, gradient_accumulation=10))
    assert one.breakdown["compute"] <= report.pipeline_s <= 1.03 * one.breakdown["compute"]
    # as published: batch norms over pairs of replicas, input stream copies without IO tiles
    card = ModelCard.from_run(run=report, **sized.CARD_FIELDS["resnet50"])
    est = predict(card, StepConfig("POD16", 16, micro_batch=20, gradient_accumulation=10))
    assert est.breakdown["stream_copy"] == pytest.approx(
        10 * (1e-6 + 20 * card.input_bytes_per_item / 12.8e9))
    batch_norms = sum(c for ops in card.compute_ops for r, c in ops.ops if r.dims
                      and r.kind == "normalisation")
    assert batch_norms == 53 + 37 + 53  # forward, recomputed (6 of 7 pieces), backward
    assert 0 < est.breakdown["norm_allreduce"] < 0.02 * est.step_s
    for label, *_, published, _ in sized.PUBLISHED["resnet50"][:2]:
        assert 0.75 <= est.samples_per_s / published <= 1.25, label  # MLPerf v1.0 and v1.1
    training.destroy()


@pytest.mark.slow  # BERT-Large, 24 layers over 4 IPUs, micro-batch 8, one pass on the CPU
def test_bert_large_phase1_at_its_published_configuration():
    """BERT-Large phase 1 as Graphcore pipelines it (4 IPUs, micro-batch 8, LAMB state in
    Streaming Memory) compiles, fits its IPUs, counts the FLOPs PyTorch's counter counts,
    and predicts Bow Pod16's published throughput within 25%."""
    from collectives.step_model import ModelCard, StepConfig, predict

    sized = load("size_published")
    training, batch = sized._bert(8, 24)
    training.compile(*batch)
    report = training.modelReport()
    assert [s.ipu for s in report.stages] == [0, 1, 2, 3]
    assert all(m["total"] <= 940_572_672 for m in report.memory.values())
    want = _forward_flops_counted_by_torch(lambda: sized.Bert(layers=24),
                                           lambda: sized.Bert.batch(8))
    assert sum(s.forward_flops for s in report.stages) == want
    card = ModelCard.from_run(run=report)
    label, system, replicas, ipus, accumulation, published, _ = sized.PUBLISHED["bert-large"][0]
    est = predict(card, StepConfig(system, replicas, ipus_per_replica=ipus, micro_batch=8,
                                   gradient_accumulation=accumulation))
    assert 0.75 <= est.samples_per_s / published <= 1.25
    training.destroy()
