"""Size standard models written in PyTorch at Graphcore's published configurations, and put
the prediction beside the published throughput.

    python examples/size_published.py resnet50            # ResNet-50 v1.5, micro-batch 20
    python examples/size_published.py bert-large          # BERT-Large phase 1, micro-batch 8
    python examples/size_published.py resnet50 --micro-batch 2 --image-size 64   # quick look

Each model is built here in plain PyTorch (:mod:`standard_models`), in float16 as published
(``model.half()``: ipupod computes each float16 operation in float32 and rounds it,
:mod:`poptorch.execution._precision`), wrapped in ``poptorch.trainingModel`` and compiled: one
micro-batch's forward and backward run on the CPU, and ipupod records every operation of
each pipeline stage, at the published micro-batch (:data:`COUNT_AT`; ``--micro-batch``
counts at another and scales the work to the published one, not the syncs). ResNet-50 is
laid out as Graphcore's MLPerf runs lay it out (:data:`RESNET_PIECES`: seven pieces on one
IPU, each recomputed before its backward pass), which is how micro-batch 20 fits one IPU, and
fed as they feed it (:class:`EightBitResNet`: 8-bit images normalised on the IPU).
``ModelCard.from_run(run=model.modelReport(), **CARD_FIELDS[model])`` makes the run a model
card (:data:`CARD_FIELDS`: what the published configuration sets beyond the PyTorch run,
ResNet-50's batch norm distributed over pairs of replicas), and :func:`collectives.step_model.predict` prices the published configurations from it:
each operation by the per-operation compute model on the system's chip
(:mod:`collectives.performance.compute_model`), the gradient all-reduce on the POD's links,
the weight update, the host I/O. Nothing is fitted to the published figures; the ratio
predicted / published is printed as it comes out. For ResNet-50 the five ratios of MLPerf
v1.1 time to train between POD sizes follow (:mod:`mlperf_v11`), ResNet-50's from this
run's card.

Published figures (the configurations are Graphcore's; where the source gives only the
global batch, the split into replicas, micro-batch and gradient accumulation is ipupod's
reading, marked "reading"):

* ResNet-50 v1.5, IPU-POD16 (GC200), MLPerf Training v1.0: 27,527 images/s at micro-batch
  20, 16 replicas of 1 IPU (issue 30 of this project, from Graphcore's MLPerf v1.0
  submission); gradient accumulation 10 (v1.1's logs give 10 on IPU-POD16);
* ResNet-50 v1.5 on IPU-POD16 / POD64 / POD128 / POD256 (GC200), MLPerf Training v1.1
  closed division (TensorFlow 1, SDK 2.3): 29,657 / 108,312 / 186,000 / 351,005 images/s,
  16 / 64 / 128 / 256 replicas of 1 IPU, micro-batch 20, gradient accumulation 10 / 3 / 2 / 2
  (the logs' ``global_batch_size`` 3,200 / 3,840 / 5,120 / 10,240 and
  ``gradient_accumulation_steps``): ImageNet's 1,281,167 training images over the fastest
  epoch of each submitted run (``epoch_start`` to ``epoch_stop``, no checkpoint saved in
  it), the median over the runs that converged (mlcommons/training_results_v1.1,
  ``Graphcore/results/ipu-pod*-TF1/resnet/result_*.txt``);
* ResNet-50 v1.5 on Bow Pod16 / Pod64 / Pod256 (TensorFlow 1, global batch 1,920 / 2,560 /
  10,240): 42,029 / 145,287 / 425,514 images/s (graphcore.ai/performance-results, "Bow
  Platform - Training", Pre-SDK 2.5); 1 IPU per replica, micro-batch 20, gradient
  accumulation 6 / 2 / 2 (reading: global batch / replicas / 20);
* BERT-Large phase 1 pre-training (sequence length 128), Bow Pod16 / Pod64 (PopART, global
  batch 65,536): 5,179 / 19,353 sequences/s (the same page); 4 IPUs per replica (the
  embedding and 3 layers, then 7, 7 and 7 layers with the heads; Graphcore's BERT-Large
  pipeline), 4 / 16 replicas, micro-batch 8, gradient accumulation 2,048 / 512 (reading);
  LAMB with its state in Streaming Memory.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import poptorch  # noqa: E402
from collectives.step_model import ModelCard, StepConfig, predict  # noqa: E402
from standard_models import Bert, ResNet, resnet50  # noqa: E402

_PERF = "graphcore.ai/performance-results (Bow Platform - Training, Pre-SDK 2.5)"
_MLPERF = "MLPerf Training v1.1 result logs (fastest epoch)"
#: model -> [(label, system, replicas, IPUs per replica, gradient accumulation, published
#: items/s, source)], micro-batch as the model's default.
PUBLISHED = {
    "resnet50": [
        ("IPU-POD16 MLPerf v1.0", "POD16", 16, 1, 10, 27_527,
         "MLPerf Training v1.0, Graphcore (issue 30)"),
        ("IPU-POD16 MLPerf v1.1", "POD16", 16, 1, 10, 29_657, _MLPERF),
        ("IPU-POD64 MLPerf v1.1", "POD64", 64, 1, 3, 108_312, _MLPERF),
        ("IPU-POD128 MLPerf v1.1", "POD128", 128, 1, 2, 186_000, _MLPERF),
        ("IPU-POD256 MLPerf v1.1", "POD256", 256, 1, 2, 351_005, _MLPERF),
        ("Bow Pod16", "BOW-POD16", 16, 1, 6, 42_029, _PERF),
        ("Bow Pod64", "BOW-POD64", 64, 1, 2, 145_287, _PERF),
        ("Bow Pod256", "BOW-POD256", 256, 1, 2, 425_514, _PERF),
    ],
    "bert-large": [
        ("Bow Pod16 phase 1", "BOW-POD16", 4, 4, 2048, 5_179, _PERF),
        ("Bow Pod64 phase 1", "BOW-POD64", 16, 4, 512, 19_353, _PERF),
    ],
}
#: The published micro-batch of each model (the step is priced at it).
MICRO_BATCH = {"resnet50": 20, "bert-large": 8}
#: The micro-batch each model is counted at by default: the published one. ResNet-50 at 20
#: fits one IPU as Graphcore lays it out (:data:`RESNET_PIECES`: 0.70 GB of 0.94 GB in
#: ipupod's plan; without recomputation it needed 1.5 GB when its batch norms' outputs were
#: still counted in float32).
COUNT_AT = {"resnet50": 20, "bert-large": 8}


#: Where Graphcore's MLPerf ResNet-50 cuts its one-IPU replica into recomputation pieces:
#: ``pipeline_splits: [b1/0/relu, b1/2/relu, b2/0/relu, b2/2/relu, b3/0/relu, b3/3/relu]`` with
#: ``shards: 1``, ``pipeline_schedule: Sequential``, ``enable_recomputation: True``
#: (mlcommons/training_results_v1.1, Graphcore/benchmarks/resnet/implementations/tensorflow/
#: configs.yml, ``mk2_resnet50_mlperf_pod16_lars``): after bottlenecks 0 and 2 of the first
#: group, 0 and 2 of the second, 0 and 3 of the third; as indices of the 16 bottlenecks of
#: :class:`standard_models.ResNet` (3, 4, 6, 3), the bottleneck each piece begins with.
RESNET_PIECES = (1, 3, 4, 6, 8, 11)


#: What Graphcore's MLPerf ResNet-50 sets that the PyTorch run does not show, for its card:
#: batch-norm statistics all-reduced over pairs of replicas (``BN_span: 2``, TF-IPU's
#: ``distributed_batch_norm_replica_group_size``; the result logs' ``model_bn_span`` is 40 =
#: 2 replicas x micro-batch 20). No IO tiles (their ``--num-io-tiles`` defaults to 0 and no
#: MLPerf configuration sets it), the card's default.
CARD_FIELDS = {"resnet50": {"distributed_batch_norm_replica_group_size": 2}, "bert-large": {}}
#: ImageNet's per-channel mean and standard deviation of 0..1 pixels (the normalisation
#: Graphcore's ``normalise_image`` applies on the IPU with ``normalise_input: True``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class EightBitResNet(ResNet):
    """ResNet-50 v1.5 fed 8-bit images and normalising them on the IPU, as Graphcore's MLPerf
    runs feed it (their config: ``eight_bit_io: True``, ``fused_preprocessing: True``, the
    uint8 image normalised by ``ipu.image_ops.normalise_image``): the host streams 150,528
    bytes an image (224 x 224 x 3 uint8), not float16's 301,056."""

    def __init__(self):
        super().__init__((3, 4, 6, 3))
        self.register_buffer("offsets", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("scales", 1 / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

    def forward(self, images, labels):
        x = (images.to(self.offsets.dtype) * (1 / 255) - self.offsets) * self.scales
        return super().forward(x, labels)


def _resnet(micro_batch: int, image_size: int, accumulation: int = 10):
    """ResNet-50 as Graphcore's MLPerf runs lay it out on one IPU: seven pieces of the model
    on IPU 0 run one after another (``ShardedExecution``, PopTorch's sequential schedule),
    each piece's forward pass recomputed before its backward pass from its input
    (``autoRecomputation``), float16 weights, SGD with momentum (LARS keeps the same state),
    ``accumulation`` micro-batches a step, float16 partials (their config's
    ``enable_half_partials: True``: ``Precision.setPartialsType(torch.half)``), uint8 images
    (:class:`EightBitResNet`)."""
    model = EightBitResNet().half()
    for first in RESNET_PIECES:
        poptorch.BeginBlock(model.layers[first], f"layers{first}", ipu_id=0)
    opts = poptorch.Options()
    opts.setExecutionStrategy(poptorch.ShardedExecution(poptorch.AutoStage.AutoIncrement))
    opts._Popart.set("autoRecomputation", 3)  # PopART RecomputationType::Pipeline
    opts.Precision.setPartialsType(torch.half)
    opts.Training.gradientAccumulation(accumulation)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (micro_batch * accumulation, 3, image_size, image_size),
                           dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 1000, (micro_batch * accumulation,), generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return poptorch.trainingModel(model, opts, optimizer), (images, labels)


class _PretrainingLoss(Bert):
    """BERT whose MLM + NSP loss is PopTorch's one final loss (``identity_loss``)."""

    def forward(self, *inputs):
        return poptorch.identity_loss(super().forward(*inputs), reduction="none")


def _bert(micro_batch: int, layers: int, accumulation: int = 8):
    model = _PretrainingLoss(layers=layers).half()
    cuts = [round(layers * c / 24) for c in (3, 10, 17)]  # 3, 7, 7, 7 layers of 24
    for ipu, first in enumerate(cuts, start=1):
        poptorch.BeginBlock(model.layers[first], f"layers{first}", ipu_id=ipu)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False))
    optimizer = poptorch.optim.LAMB(model.parameters(), lr=1e-3)
    batch = Bert.batch(micro_batch * accumulation)
    return poptorch.trainingModel(model, opts, optimizer), batch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(PUBLISHED))
    p.add_argument("--micro-batch", type=int, default=None,
                   help="micro-batch to count at (default: the published one, at which "
                        "the step is priced)")
    p.add_argument("--image-size", type=int, default=224, help="ResNet-50's input size")
    p.add_argument("--layers", type=int, default=24, help="BERT's encoder layers")
    args = p.parse_args(argv)
    micro = args.micro_batch or COUNT_AT[args.model]
    torch.manual_seed(0)
    if args.model == "resnet50":
        training, inputs = _resnet(micro, args.image_size)
    else:
        training, inputs = _bert(micro, args.layers)
    training.compile(*inputs)
    report = training.modelReport()
    print(report.table())
    card = ModelCard.from_run(run=report, **CARD_FIELDS[args.model])
    published_micro = MICRO_BATCH[args.model]
    print(f"\n{args.model}: {card.params:,} parameters, counted at micro-batch "
          f"{card.compute_micro_batch}, priced at {published_micro}\n")
    rows, first = [], None
    for label, system, replicas, ipus, accumulation, published, source in \
            PUBLISHED[args.model]:
        est = predict(card, StepConfig(system, replicas, ipus_per_replica=ipus,
                                       micro_batch=published_micro,
                                       gradient_accumulation=accumulation))
        first = first or est
        rows.append((label, est.samples_per_s, published, source))
    print(f"{'configuration':<24}{'predicted/s':>13}{'published/s':>13}{'ratio':>8}  source")
    for label, predicted, published, source in rows:
        print(f"{label:<24}{predicted:>13,.0f}{published:>13,}{predicted / published:>8.2f}"
              f"  {source}")
    print()
    print(first.table())
    if args.model == "resnet50":
        _mlperf_ratios(card, published_micro)
    training.destroy()
    return 0


def _mlperf_ratios(card: ModelCard, micro_batch: int) -> None:
    """The five MLPerf v1.1 ratios of time to train (:mod:`mlperf_v11`), ResNet-50's from
    this run's card, BERT-Large's from examples/size_bert_large.py's."""
    import mlperf_v11
    from size_bert_large import CARD as BERT_CARD

    rates = mlperf_v11.predicted_rates({"bert-large": BERT_CARD})
    for system, p in mlperf_v11.RESNET50.items():
        rates[("resnet50", system)] = predict(card, StepConfig(
            system, p.replicas, micro_batch=micro_batch,
            gradient_accumulation=p.gradient_accumulation)).samples_per_s
    print("\n" + mlperf_v11.table(mlperf_v11.ratios(rates)))
    print("\nwith the logs' host-side seconds added to each predicted time "
          "(mlperf_v11.Published.host_side_s)\n")
    print(mlperf_v11.table(mlperf_v11.ratios_with_host_side(rates)))


if __name__ == "__main__":
    raise SystemExit(main())
