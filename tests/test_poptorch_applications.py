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
        for batch in poptorch.DataLoader(poptorch.Options(), data, batch_size=4,
                                         mode=poptorch.DataLoaderMode.Async):
            assert batch[0].shape == (4,)  # a loader iterated without a name lives on
    finally:
        gc.enable()
    assert not [t for t in threading.enumerate() if t is worker]
