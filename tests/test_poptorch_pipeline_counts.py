"""PopTorch models over several IPUs (issue 23): bit-for-bit equality with the unsplit model,
the counts (FLOPs, activations) against hand counts, memory and the out-of-memory error,
modelled time, the run report, trace and model card."""

import copy

import pytest
import torch

import poptorch
from tests.poptorch_chain import Chain, F, annotate, data, training
from tests.poptorch_models import plain_call


# -- numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("R", [1, 2])
def test_pipelined_weights_equal_the_unsplit_model_bit_for_bit(R):
    G, di, B = 4, 2, 3
    x, y = data(di * G * R * B, width=16)
    base = Chain(3, width=16)
    unsplit = copy.deepcopy(base)
    plain = copy.deepcopy(base)
    pipelined = annotate(copy.deepcopy(base), [0, 1, 1])
    sharded = annotate(copy.deepcopy(base), [0, 1, 1])
    for net, strategy in ((unsplit, None), (pipelined, None),
                          (sharded, poptorch.ShardedExecution())):
        model = training(net, G=G, di=di, R=R, strategy=strategy)
        model(x, y)
        model(x, y)
        model.destroy()
    logits = Logits(plain)
    opt = torch.optim.SGD(logits.parameters(), lr=0.1)
    for _ in range(2):
        plain_call(logits, opt, x, y, di, G, R)
    for a, b, c, d in zip(unsplit.parameters(), pipelined.parameters(), sharded.parameters(),
                          plain.parameters()):
        assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


@pytest.mark.parametrize("R", [1, 2])
def test_running_mean_accumulation_of_a_pipelined_model_equals_the_unsplit_model(R):
    """The running mean treats each stage's parameters after that stage's backward passes
    (per local replica): the same bits as the unsplit model with the running mean, and the
    post-accumulation mean up to rounding."""
    from poptorch import enums
    x, y = data(2 * 4 * R * 3, width=16)
    base = Chain(3, width=16)
    results = []
    for blocks, strategy in ((None, enums.MeanReductionStrategy.Running),
                             ([0, 1, 1], enums.MeanReductionStrategy.Running),
                             ([0, 1, 1], enums.MeanReductionStrategy.Post)):
        net = copy.deepcopy(base) if blocks is None else annotate(copy.deepcopy(base), blocks)
        model = training(net, G=4, di=2, R=R)
        model.options.Training.setMeanAccumulationAndReplicationReductionStrategy(strategy)
        model(x, y)
        model.destroy()
        results.append([p.detach().clone() for p in net.parameters()])
    unsplit, running, post = results
    assert all(torch.equal(a, b) for a, b in zip(unsplit, running))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(running, post))


class Logits(torch.nn.Module):
    """A Chain's logits alone (the plain PyTorch loop's model)."""

    def __init__(self, chain: Chain):
        super().__init__()
        self.chain = chain

    def forward(self, x):
        for layer in self.chain.layers:
            x = torch.tanh(layer(x))
        return self.chain.head(x)


def test_the_gradients_of_micro_batches_add_in_ascending_order():
    """The order is what makes the bits: summed the other way round the same per-micro-batch
    gradients give other bits for this model, ascending gives the pipelined model's."""
    G, B = 6, 1
    x, y = data(G * B, seed=5)
    x = x * torch.tensor([1e4, 1e-3, 1.0, 7.0, 1e-2, 3.0, 1e3, 0.5])
    net = annotate(Chain(2), [0, 1])
    model = training(net, G=G, lr=1.0)
    before = copy.deepcopy(net)
    model(x, y)
    grads = []
    for m in range(G):
        ref = copy.deepcopy(before)
        ref(x[m:m + 1], y[m:m + 1])[1].backward()
        grads.append([p.grad for p in ref.parameters()])

    def apply(order):
        out = []
        for i, p in enumerate(before.parameters()):
            acc = None
            for m in order:
                acc = grads[m][i].clone() if acc is None else acc + grads[m][i]
            out.append(p.detach() - acc / G)
        return out
    ascending, descending = apply(list(range(G))), apply(list(reversed(range(G))))
    assert all(torch.equal(a, p) for a, p in zip(ascending, net.parameters()))
    assert not all(torch.equal(d, p) for d, p in zip(descending, net.parameters()))


def test_flops_of_linear_and_conv2d_against_hand_counts():
    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 5, kernel_size=3, padding=1)
            self.lin = torch.nn.Linear(5 * 6 * 6, 4)

        def forward(self, x, y):
            h = self.conv(x)
            out = self.lin(h.reshape(len(x), -1))
            return out, F.cross_entropy(out, y)

    B = 2
    net = Conv()
    poptorch.BeginBlock(net.lin, "lin", ipu_id=1)
    model = training(net, G=3)
    model.compile(torch.randn(3 * B, 3, 6, 6), torch.randint(0, 4, (3 * B,)))
    conv, lin = model.modelReport().stages
    conv_fwd = 2 * B * 5 * 6 * 6 * 3 * 3 * 3       # 2 x outputs x (C_in x k x k)
    lin_fwd = 2 * B * 180 * 4
    assert (conv.forward_flops, lin.forward_flops) == (conv_fwd, lin_fwd)
    # backward: the conv's weight gradient only (its input needs none), the linear's weight
    # and input gradients
    assert (conv.backward_flops, lin.backward_flops) == (conv_fwd, 2 * lin_fwd)


def test_activation_bytes_against_hand_counts():
    """Stage 0 keeps its input (for the first layer's weight gradient) and the tanh result
    (tanh's backward; also the second layer's input, one storage); stage 1 keeps its input
    copy and the classifier's log-softmax."""
    B, W, C = 5, 8, 3
    net = annotate(Chain(2, width=W, classes=C), [0, 0])
    poptorch.BeginBlock(net.head, "head", ipu_id=1)
    model = training(net, G=3)
    x, y = data(3 * B, W, C)
    model.compile(x, y)
    s0, s1 = model.modelReport().stages
    assert s0.saved_bytes == B * W * 4 + 2 * B * W * 4
    assert s1.input_bytes == B * W * 4 + B * 8  # the boundary copy and the int64 labels
    assert s0.input_bytes == B * W * 4


def test_out_of_memory_at_compile_names_the_ipu_bytes_and_largest_tensors():
    class Huge(Chain):
        def __init__(self):
            super().__init__(2)
            # 1.2e9 bytes counted, 4 bytes stored: an expanded view
            self.big = torch.nn.Parameter(torch.zeros(1).expand(300_000_000),
                                          requires_grad=False)

        def forward(self, x, y):
            out, loss = super().forward(x, y)
            return out, loss + self.big[0]

    net = annotate(Huge(), [0, 1])
    x, y = data(3)
    with pytest.raises(poptorch.Error, match=r"Out of memory: Cannot fit all variable data onto "
                                             r"one or more tiles. IPU \d+ \(IPU 1 of replica 0\) "
                                             r"needs 1,2\d\d,\d{3},\d{3} bytes, it has "
                                             r"940,572,672 bytes .* largest tensors: "
                                             r"'training/param/big' \(1,200,000,000 bytes\)"):
        training(net, G=3)(x, y)


def test_memory_per_ipu_locations_and_recomputation():
    G = 5
    x, y = data(G * 4, width=32)
    net = annotate(Chain(2, width=32), [0, 1])
    model = training(copy.deepcopy(net), G=G)
    model.compile(x, y)
    report = model.modelReport()
    s0 = report.stages[0]
    assert report.recompute and s0.stash_depth == 2 and s0.recompute_flops == s0.forward_flops
    first = next(iter(report.memory.values()))
    # recomputation: the stash holds the stage input (x2 in flight), one micro-batch rebuilt
    assert first["activations"] == 2 * s0.input_bytes + s0.saved_bytes
    assert first["parameters"] == 32 * 32 * 4 + 32 * 4
    assert first["accumulators"] == first["parameters"] and first["streaming_memory"] == 0

    opts = poptorch.Options()
    opts.Training.gradientAccumulation(G)
    opts.TensorLocations.setAccumulatorLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False))
    opts._Popart.set("autoRecomputation", 0)
    moved = poptorch.trainingModel(copy.deepcopy(net), opts)
    moved.compile(x, y)
    r2 = moved.modelReport()
    m2 = next(iter(r2.memory.values()))
    assert not r2.recompute and r2.stages[0].recompute_flops == 0
    assert m2["accumulators"] == 0 and m2["streaming_memory"] == first["accumulators"]
    assert m2["activations"] == 2 * r2.stages[0].saved_bytes
    # no recomputation, but the accumulators cross to Streaming Memory in every backward
    # pass: the backward passes of stage 0 take longer than with recomputation alone (its
    # recomputed forward pass, priced per operation, gone)
    assert r2.stages[0].backward_s == pytest.approx(report.stages[0].backward_s
                                                    - model._clock.forward_s[0], rel=1e-9)
    bandwidth = moved._clock.chip.streaming_memory_bytes_per_s_per_ipu
    b0 = [e.duration_s for e in moved._clock.templates[0].events[0]
          if e.kind == "compute" and e.label == "B0"]
    assert len(b0) == G and b0[0] == pytest.approx(
        r2.stages[0].backward_s + 2 * m2["streaming_memory"] / bandwidth, rel=1e-12)


def test_checkpoints_cut_the_rebuilt_activations():
    """Eight tanh layers on IPU 0 (the classifier on IPU 1), micro-batch 4 x 64: every
    tensor saved is t = 1 KiB (the input and the eight tanh results). Without a checkpoint
    stage 0 stashes its input (depth 2) and rebuilds all nine: 11 t; with a checkpoint after
    layer 3 it stashes input and checkpoint (2 x 2 t) and rebuilds the larger half (5 t)."""
    class Checked(Chain):
        def forward(self, x, y):
            for i, layer in enumerate(self.layers):
                x = torch.tanh(layer(x))
                if i == 3:
                    x = poptorch.recomputationCheckpoint(x)
            out = self.head(x)
            return out, F.cross_entropy(out, y)

    G, t = 3, 4 * 64 * 4
    x, y = data(G * 4, width=64)
    reports = []
    for cls in (Chain, Checked):
        net = cls(8, width=64)
        poptorch.BeginBlock(net.head, "head", ipu_id=1)
        model = training(net, G=G)
        model.compile(x, y)
        reports.append(model.modelReport())
    before, after = (r.memory[next(iter(r.memory))] for r in reports)
    assert before["activations"] == 11 * t and after["activations"] == 9 * t
    s0 = reports[1].stages[0]
    assert s0.saved_bytes == reports[0].stages[0].saved_bytes == 9 * t
    assert s0.recompute_flops == s0.forward_flops  # the forward is run again either way


def test_pieces_on_one_ipu_share_their_working_sets():
    """Eight tanh layers cut into two pieces on IPU 0 (the classifier a third), run one after
    another with recomputation, as Graphcore's single-IPU ResNet-50: every tensor saved is
    t = 1 KiB. Each of the first two pieces stashes its input (t) and rebuilds its five saved
    tensors (its input and four tanh results) before its backward pass; the classifier keeps
    its saved tensors through its own forward and backward. One pass runs at a time, so IPU
    0 holds the two stashes and the largest working set: 2 t + 5 t, not their sum."""
    G, t = 2, 4 * 64 * 4
    net = Chain(8, width=64)
    for i in (0, 4):
        poptorch.BeginBlock(net.layers[i], f"L{i}", ipu_id=0)
    poptorch.BeginBlock(net.head, "head", ipu_id=0)
    model = training(net, G=G, strategy=poptorch.ShardedExecution(
        poptorch.AutoStage.AutoIncrement))
    model.options._Popart.set("autoRecomputation", 3)
    x, y = data(G * 4, width=64)
    model.compile(x, y)
    report = model.modelReport()
    s0, s1, head = report.stages
    assert s0.saved_bytes == s1.saved_bytes == 5 * t and head.saved_bytes < 5 * t
    assert (report.memory[next(iter(report.memory))]["activations"] == 2 * t + 5 * t)
    assert s0.recompute_flops == s0.forward_flops and head.recompute_flops == 0


def test_modelled_time_report_and_cycle_count():
    G = 4
    x, y = data(G * 2)
    net = annotate(Chain(2), [0, 1])
    model = training(net, G=G, logCycleCount=True)
    model.compile(x, y)
    with pytest.raises(poptorch.Error, match="run the model"):
        model.cycleCount()
    model(x, y)
    report = model.modelReport()
    timelines = model._device.replica_timelines(0)
    spent = max(t.now_s for t in timelines.values())
    assert report.steps == 1 and report.modelled_s == pytest.approx(report.last_call_s)
    assert report.step_s == pytest.approx(report.planned_step_s + report.reduction_s)
    assert report.modelled_s <= spent + 1e-15
    kinds = {e.kind for t in timelines.values() for e in t.events()}
    assert {"compute", "copy", "host_io", "sync"} <= kinds
    labels = [e.label for e in timelines[0].events() if e.kind == "compute"]
    assert labels[:2] == ["F0", "F0"] and "weight update" in labels
    assert model.cycleCount() == round(report.last_call_s * 1.33e9)
    assert 0 < report.bubble_fraction < 1
    assert "bubble" in report.table() and "stage 1 on IPU 1" in report.table()


def test_recorded_only_annotations_are_in_the_report():
    class Noted(Chain):
        def forward(self, x, y):
            with poptorch.MultiConv().availableMemoryProportions([0.3]).planType(
                    poptorch.MultiConvPlanType.Serial):
                x = poptorch.set_available_memory(self.layers[0](x), 0.4)
            out = self.head(x)
            return out, F.cross_entropy(out, y)

    with pytest.raises(AssertionError, match="MultiConv.partialsTypes"):
        poptorch.MultiConv().partialsTypes("half")
    model = training(Noted(1), setAvailableMemoryProportion={"IPU0": 0.5})
    model(*data(1))
    entry = model._describe()
    notes = entry["model"]["stages"][0]["notes"]
    assert ["available_memory_proportion", "0.4"] in [list(n) for n in notes]
    assert any(n[0] == "multi_conv" for n in notes)
    assert entry["options"]["not_acted_on"]["available_memory_proportion"] == {"0": 0.5}


# -- reports ------------------------------------------------------------------------------

def test_run_report_and_trace_of_a_replicated_pipeline(tmp_path):
    """Two replicas of a two-IPU pipeline: the job system's run report has each IPU's passes
    on its modelled timeline, the copies between the stages' IPUs, the gradient reduction;
    the trace draws them on IPU and link tracks; the poptorch section has the model's stages
    and memory per IPU; the step estimate is the model's own card."""
    import json

    import collectives.run_report as R
    import ipu_node
    from collectives._engine.runtime import get_engine

    G, R_ = 3, 2
    x, y = data(G * R_ * 2)
    model = training(annotate(Chain(2), [0, 1]), G=G, R=R_)
    model(x, y)
    system = ipu_node.get_system()
    report_path, trace_path = R.write_report(str(tmp_path), system, get_engine(system).ledger)
    report = json.loads(open(report_path).read())
    replica_ipus = model._device.replica_ipus
    assert report["ipus_per_replica"] == 2 and report["replicas"] == 2
    for ipus in replica_ipus:
        first, second = (report["timeline"][str(i)] for i in ipus)
        assert [e["label"] for e in first if e["kind"] == "compute"][:2] == ["F0", "F0"]
        assert {e["label"] for e in second if e["kind"] == "compute"} >= {"F1", "B1"}
        assert any(e["kind"] == "copy" and e["peer"] == ipus[1] for e in first)
        assert any(e["kind"] == "copy" and e["peer"] == ipus[0] for e in second)
        assert any(e["kind"] == "collective" for e in first)
        assert report["ipus"][str(ipus[0])]["compute_s"] > 0
    section = report["sections"]["poptorch"]["models"]
    entry = next(m for m in section if m["alive"] and m["ipus"] == [list(i) for i in
                                                                   replica_ipus])
    assert [s["ipu"] for s in entry["model"]["stages"]] == [0, 1]
    assert set(entry["model"]["memory"]) == {str(i) for i in replica_ipus[0]}
    estimate = report["step_estimate"]
    assert estimate["card"]["params"] == sum(p.numel() for p in model.parameters())
    assert estimate["config"]["gradient_accumulation"] == G
    trace = json.loads(open(trace_path).read())["traceEvents"]
    names = {(e["pid"], e["tid"]) for e in trace if e["ph"] == "X"}
    assert {(1, replica_ipus[0][0] + 1), (1, replica_ipus[0][1] + 1), (2, 1)} <= names
    model.destroy()


def test_the_poptorch_report_and_trace_of_free_devices(tmp_path, monkeypatch, capsys):
    import json

    from poptorch.modelling import _report

    x, y = data(4)
    model = training(annotate(Chain(2), [0, 1]), G=4)
    model(x, y)
    monkeypatch.setenv("IPUPOD_REPORT_DIR", str(tmp_path))
    _report._write_at_exit()
    written = json.loads((tmp_path / "report-0.json").read_text())
    assert written["ipus"][str(model._device.replica_ipus[0][1])]["compute_s"] > 0
    mine = [m for m in written["sections"]["poptorch"]["models"] if m["alive"] and m["model"]["steps"]
            and m["ipus"] == [list(model._device.replica_ipus[0])]]
    assert mine and mine[0]["model"]["schedule"] == "PipelinedExecution"
    trace = json.loads((tmp_path / "trace-0.json").read_text())["traceEvents"]
    ipu = model._device.replica_ipus[0][1]
    assert any(e["ph"] == "X" and e["tid"] == ipu + 1 and e["name"] == "B1" for e in trace)
    assert "poptorch model 'training': PipelinedExecution" in capsys.readouterr().out
    model.destroy()


def test_a_card_from_the_run_answers_what_if():
    from collectives.step_model import ModelCard, StepConfig, predict, what_if

    G = 3
    x, y = data(G * 4, width=16)
    model = training(annotate(Chain(2, width=16), [0, 1]), G=G)
    model(x, y)
    report = model.modelReport()
    card = ModelCard.from_run(run=report)
    stages = report.stages
    assert card.params == sum(p.numel() for p in model.parameters())
    assert card.flops_per_item == pytest.approx(sum(
        s.forward_flops + s.backward_flops + s.recompute_flops for s in stages) / 4)
    assert card.input_bytes_per_item == 16 * 4 + 8 and len(card.stage_shares) == 2
    config = StepConfig("POD16", 8, ipus_per_replica=2, micro_batch=4, gradient_accumulation=G)
    pod64 = what_if(card, config, system="POD64", replicas=32)
    pod16 = predict(card, config)
    assert pod64.config.system_name == "POD64" and pod64.breakdown["allreduce"] > 0
    # the same compute per replica on both PODs: the model's operations priced on the GC200
    # (the slowest IPU's), or with an efficiency given, its counted FLOPs at that share of peak
    from ipu_node.chips import GC200
    assert len(card.compute_ops) == 2 and card.compute_micro_batch == 4
    assert pod64.breakdown["compute"] == pod16.breakdown["compute"] == pytest.approx(
        G * max(ops.price(GC200, dtype="float32").total_s for ops in card.compute_ops))
    assert sum(pod16.compute_breakdown.values()) == pytest.approx(pod16.breakdown["compute"])
    assert pod16.top_ops and "compute by operation" in pod16.table()
    # with an efficiency, each stage's share of the FLOPs at that share of peak; the first
    # stage also waits for its micro-batch's input stream copy (PCIe latency + its bytes at
    # 12.8 GB/s), which here outweighs the few FLOPs: the step waits for the first stage
    stage = [s * card.flops_per_item * 4 / (62.4e12 * 0.5) for s in card.shares_for(2)]
    stream = 1e-6 + 4 * card.input_bytes_per_item / 12.8e9
    assert stage[0] + stream > stage[1]
    est = predict(card, config, efficiency=0.5)
    assert est.breakdown["compute"] == pytest.approx(G * stage[0])
    assert est.breakdown["stream_copy"] == pytest.approx(G * stream)
    assert est.breakdown["bubble"] == pytest.approx(stage[0] + stream)
    with pytest.raises(ValueError, match="unknown field"):
        ModelCard.from_run(run={"params": 1, "flops_per_item": 1.0, "layers": 3})
