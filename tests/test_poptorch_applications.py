"""What Graphcore's PopTorch applications do beyond the tutorials (issue 34): BatchNorm models
trained with replicas, ``horovod.torch`` beside poptorch, one report per instance, several
DataLoaders, and the calls the applications make that act on nothing here."""

import copy

import torch

import poptorch
from tests.poptorch_models import WithLoss, bn_resnet, plain_call


def _images(rows: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 3, 6, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)


def test_a_batchnorm_resnet_trains_with_replicas_each_keeping_its_statistics():
    """Graphcore's CNN application: a BatchNorm ResNet, 2 replicas, default options
    (broadcastBuffers(True)). The weights are a plain loop's, bit for bit; each replica's
    running statistics are those of its own micro-batches; the host copy holds replica 0's."""
    R, B = 2, 4
    net = bn_resnet()
    initial = copy.deepcopy(net)
    ref = copy.deepcopy(net)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    model = poptorch.trainingModel(WithLoss(net), poptorch.Options().replicationFactor(R),
                                   torch.optim.SGD(net.parameters(), lr=0.1))
    x, y = _images(R * B)
    model(x, y)
    plain_call(ref, ref_opt, x, y, 1, 1, R)
    for mine, theirs in zip(net.parameters(), ref.parameters()):
        assert torch.equal(mine, theirs)
    stats = []
    for r in range(R):    # each replica's micro-batch through the initial BatchNorm stem
        stem = copy.deepcopy(initial[1]).train()
        stem(initial[0](x[r * B:(r + 1) * B]))
        stats.append(stem.running_mean)
    assert not torch.equal(stats[0], stats[1])
    assert torch.equal(net[1].running_mean, stats[0])       # the host copy: replica 0's
    assert int(net[1].num_batches_tracked) == 1
    model(x, y)
    assert int(net[1].num_batches_tracked) == 2


def test_a_buffer_the_model_writes_itself_still_needs_broadcast_buffers_off():
    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = bn_resnet()
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x, y):
            self.seen += 1
            out = self.net(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    x, y = _images(8)
    model = poptorch.trainingModel(Counting(), poptorch.Options().replicationFactor(2))
    try:
        model(x, y)
    except poptorch.Error as exc:
        assert "broadcastBuffers(False)" in exc.message
    else:
        raise AssertionError("a buffer written by the model's own code was accepted")
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(False)
    poptorch.trainingModel(Counting(), opts)(x, y)


def test_one_report_per_instance_that_ipupod_report_reads(tmp_path, monkeypatch, capsys):
    """A one-process PopTorch run (one replica: the model's own IPUs) writes report-0.json
    and trace-0.json, nothing else; ipupod-report prints the model's stages, memory and
    modelled step and plots them."""
    import json

    from collectives import report_cli
    from poptorch.modelling import _report

    net = bn_resnet()
    model = poptorch.trainingModel(WithLoss(net), poptorch.Options().deviceIterations(2))
    model(*_images(8))
    monkeypatch.setenv("IPUPOD_REPORT_DIR", str(tmp_path))
    _report._write_at_exit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report-0.json", "trace-0.json"]
    written = json.loads((tmp_path / "report-0.json").read_text())
    ipu = str(model._device.replica_ipus[0][0])
    assert written["ipus"][ipu]["compute_s"] > 0 and written["ipus"][ipu]["memory_peak_bytes"]
    section = written["sections"]["poptorch"]
    assert any(k.endswith("stage 0 backward") for k in section["breakdown"])
    capsys.readouterr()
    assert report_cli.main([str(tmp_path / "report-0.json"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "poptorch model 'training': single stage" in out and "IPU " + ipu in out
    assert (tmp_path / "report-0-breakdown.png").stat().st_size > 0
    model.destroy()


def test_horovod_torch_is_collectives_horovod_with_the_timeline_recorded():
    import collectives.horovod
    import poptorch._horovod_torch as hvd
    from poptorch.modelling import _report

    assert all(getattr(hvd, n) is getattr(collectives.horovod, n)
               for n in collectives.horovod.__all__)
    hvd.start_timeline("/tmp/timeline.json")
    hvd.stop_timeline()
    calls = [c["call"] for c in _report.report()["calls"]]
    assert calls[-2:] == ["hvd.start_timeline", "hvd.stop_timeline"]


def test_a_dropped_async_loader_goes_with_no_garbage_collection():
    """No reference cycle between a DataLoader and its accessor: dropping the loader frees
    it at once and stops its worker thread (which lets the epoch's iterator go)."""
    import gc
    import threading
    import weakref

    data = torch.utils.data.TensorDataset(torch.arange(32.0))
    gc.disable()
    try:
        loader = poptorch.DataLoader(poptorch.Options(), data, batch_size=4,
                                     mode=poptorch.DataLoaderMode.Async)
        assert sum(1 for _ in loader) == 8
        worker, ref = loader._accessor._worker, weakref.ref(loader)
        del loader
        worker.join(timeout=30)
        assert ref() is None and not worker.is_alive()
        second = poptorch.DataLoader(poptorch.Options(), data, batch_size=4,
                                     mode=poptorch.DataLoaderMode.Async)
        for batch in second:
            assert batch[0].shape == (4,)
        # dropped too, so that no worker outlives the test: a live one starts its next epoch
        # and draws a seed from torch's global generator, racing a later test's manual_seed
        other, ref = second._accessor._worker, weakref.ref(second)
        del second
        other.join(timeout=30)
        assert ref() is None and not other.is_alive()
    finally:
        gc.enable()
    assert not [t for t in threading.enumerate() if t is worker]


def _train_two(order: list[int], detach_between: bool) -> list:
    nets = [bn_resnet(seed=s) for s in (0, 1)]
    models = [poptorch.trainingModel(WithLoss(n), poptorch.Options().replicationFactor(2),
                                     torch.optim.SGD(n.parameters(), lr=0.1)) for n in nets]
    x, y = _images(8)
    previous = None
    for i in order:
        if detach_between and previous not in (None, i):
            models[previous].detachFromDevice()
        if models[i].isCompiled() and not models[i].isAttachedToDevice():
            models[i].attachToDevice()
        models[i](x, y)
        previous = i
    out = [[p.detach().clone() for p in n.state_dict().values()] for n in nets]
    for m in models:
        m.destroy()
    return out


def test_two_replicated_training_models_attached_in_one_process():
    """Graphcore's applications keep more than one replicated training model attached in a
    process; they share the job's IPU system and give the bits each gives alone."""
    import ipu_node

    together = _train_two([0, 1, 0, 1], detach_between=False)
    alone = _train_two([0, 0, 1, 1], detach_between=True)
    for a, b in zip(together, alone):
        assert all(torch.equal(p, q) for p, q in zip(a, b))
    first, second = (poptorch.trainingModel(WithLoss(bn_resnet()),
                                            poptorch.Options().replicationFactor(2))
                     for _ in range(2))
    x, y = _images(8)
    first(x, y)
    second(x, y)
    system = ipu_node.get_system()
    first.detachFromDevice()
    assert system.ipus_attached and second.isAttachedToDevice()
    second(x, y)
    other = poptorch.trainingModel(WithLoss(bn_resnet()), poptorch.Options().replicationFactor(4))
    try:
        other(*_images(16))
    except poptorch.Error as exc:
        assert "another layout" in exc.message
    else:
        raise AssertionError("a model of another layout replaced the attached one's system")
    second.detachFromDevice()
    assert not system.ipus_attached
    other(*_images(16))
    for m in (first, second, other):
        m.destroy()
    ipu_node.reset_ipu_configuration()


def test_the_calls_the_applications_make_act_or_are_recorded():
    """What Graphcore's applications also call: each acts as PopTorch's does, or is accepted
    and recorded in the run report."""
    import popdist
    from poptorch.modelling import _report

    class Serialised(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = bn_resnet()
            self.proj = torch.nn.Parameter(torch.eye(3))

        def forward(self, x, y):
            x = poptorch.set_overlap_for_input(x, poptorch.OverlapMode.OverlapAccumulationLoop)
            out = poptorch.serializedMatMul(self.net(x), self.proj,
                                            poptorch.MatMulSerializationMode.OutputChannels, 2)
            out = poptorch.set_overlap_for_output(out, poptorch.OverlapMode.NoOverlap)
            return out, torch.nn.functional.cross_entropy(out, y)

    opts = poptorch.Options().broadcastBuffers(True)
    opts.Training.setAutomaticLossScaling(True)
    opts._Popart.setPatterns({"TiedGather": True}, 0)
    opts.anchorTensor("grad_proj", "Gradient___proj")
    opts.anchorTensor("proj", "UpdatedVar___proj")
    opts.anchorTensor("stats", "net.1.running_mean")
    opts.anchorTensor("popart", "Dropout:0")
    model = poptorch.trainingModel(Serialised(), opts)
    x, y = _images(4)
    with torch.no_grad():
        expected = torch.matmul(model.net(x), model.proj)
    out, _ = model(x, y)
    assert out.shape == expected.shape
    assert torch.equal(model.getAnchoredTensor("proj"), model.proj)
    assert torch.equal(model.getAnchoredTensor("stats"), model.net[1].running_mean)
    assert model.getAnchoredTensor("grad_proj").shape == (3, 3)
    assert model.getAnchoredTensor("grad_proj").abs().sum() > 0
    for name, text in (("popart", "anchors only the model's parameters"),
                       ("nothing", "has not been anchored")):
        try:
            model.getAnchoredTensor(name)
        except poptorch.Error as exc:
            assert text in exc.message
        else:
            raise AssertionError(name)
    entry = [m for m in _report.report()["models"] if m.get("alive") and
             m["options"]["not_acted_on"].get("_Popart.patterns")][-1]
    assert entry["options"]["not_acted_on"]["_Popart.automaticLossScalingSettings.enabled"]
    notes = dict(entry["model"]["stages"][0]["notes"])
    assert {"serialized_matmul", "overlap_for_input", "overlap_for_output"} <= set(notes)
    assert "getAnchoredTensor" in [c["call"] for c in _report.report()["calls"]]
    assert popdist.execute_on_instances({0}, lambda: "written") == "written"
    assert popdist.execute_on_instances({1}, lambda: "written") is None
    poptorch.removeBlocks(model.net)
    offline = poptorch.trainingModel(Serialised(), poptorch.Options().useOfflineIpuTarget(2))
    offline.compile(x, y)
    assert offline.isCompiled() and not offline.isAttachedToDevice()
    model.destroy()


def test_a_mode_left_open_across_blocks_is_named_not_dropped():
    """The pause of a pipelined forward pass steps out of its own trace only: a torch
    function mode the model enters in one block and leaves in the next is an error naming
    it (before, the pause popped it instead of the trace)."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    from tests.poptorch_chain import Chain, data, training

    class Counting(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Spanning(Chain):
        def forward(self, x, y):
            with Counting():
                with poptorch.Block(ipu_id=0):
                    x = torch.tanh(self.layers[0](x))
                with poptorch.Block(ipu_id=1):
                    out = self.head(torch.tanh(self.layers[1](x)))
            return out, F.cross_entropy(out, y)

    x, y = data(3)
    model = training(Spanning(2), G=3, strategy=poptorch.PipelinedExecution(
        poptorch.AutoStage.AutoIncrement))
    try:
        model(x, y)
    except poptorch.Error as exc:
        assert "Counting" in exc.message, exc.message
    else:
        raise AssertionError("the pause stepped out of a mode that is not its own")
