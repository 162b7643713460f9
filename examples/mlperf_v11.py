"""Graphcore's MLPerf Training v1.1 results on IPU-POD16 to IPU-POD256, and the time to train
that ipupod's step model predicts for the same configurations.

    python examples/mlperf_v11.py            # the five ratios, from the sizing examples' cards

MLPerf's published figure is the **time to train**: from ``run_start`` to ``run_stop`` in each
submitted run's log (training to the target accuracy, the evaluations included, the
compilation not), the mean of the runs left when the fastest and the slowest are dropped.
A bigger global batch takes more epochs to reach the target, so the time to train of two
POD sizes differs by the ratio of their throughputs *and* by the ratio of the data each run
trained on. Both are in the logs:

* ResNet-50 v1.5 (TensorFlow 1, closed division; ``global_batch_size`` 3,200 / 3,840 /
  5,120 / 10,240 on IPU-POD16 / 64 / 128 / 256: 16 / 64 / 128 / 256 replicas of one IPU at
  micro-batch 20 and ``gradient_accumulation_steps`` 10 / 3 / 2 / 2): every run trained 38 /
  38 / 41 / 45 epochs of ImageNet's 1,281,167 images; time to train 28.335 / 8.502 / 5.671 /
  3.792 minutes (5 runs each);
* BERT-Large (PopART, closed division; ``global_batch_size`` 3,072 / 3,072 / 6,144 on
  IPU-POD16 / 64 / 128, ``gradient_accumulation_steps`` 192 / 96 / 96): 2,521,624 /
  2,486,549 / 3,424,449 training samples to the target on average (``train_samples`` at
  ``run_stop``, 10 runs each); time to train 32.697 / 10.564 / 6.859 minutes.

Source: mlcommons/training_results_v1.1, ``Graphcore/results/ipu-pod{16,64,128,256}-TF1/
resnet/result_*.txt`` and ``Graphcore/results/ipu-pod{16,64,128}-POPART-closed/bert/
result_*.txt`` (the MLLOG lines), ``Graphcore/systems/*.json`` (one host server, two AMD EPYC
7742, per 16 IPUs at every size: ``number_of_nodes`` x ``host_processors_per_node``).

:func:`ratios` puts the five ratios of time to train between POD sizes (ResNet-50
POD16/POD64, POD64/POD128, POD64/POD256; BERT-Large POD16/POD64, POD64/POD128) beside the
model's: the data each run trained on divided by the predicted samples per second. The data
per run is the logs' (a property of the training recipe at that global batch, not of the
hardware); the throughput is ipupod's, nothing fitted. The host-side time inside the
published time is not in the model: for ResNet-50 the time to train exceeds the data over the
fastest epoch's throughput by 58.5 / 60.6 / 57.9 / 63.3 s on IPU-POD16 / 64 / 128 / 256
(checkpoints saved every fourth epoch, then the saved checkpoints evaluated one by one: 25 /
25 / 31 / 35 s after the last epoch), 28% of the POD256 run; with those seconds added to the
predicted times the ResNet-50 ratios of the per-operation card (examples/size_published.py)
are 1.03 / 1.09 / 1.09 (README, "Beyond one POD64"). :func:`ratios_with_host_side` adds each
system's host-side seconds (:attr:`Published.host_side_s`: the published time less the data
over the logs' fastest epoch's or block's throughput) to the predicted time; ``main`` prints
both tables.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from collectives.step_model import ModelCard, StepConfig, predict

__all__ = ["Published", "RESNET50", "BERT_LARGE", "IMAGENET_TRAIN_IMAGES", "RATIOS",
           "predicted_rates", "ratios", "ratios_with_host_side", "table", "main"]

#: ImageNet 2012's training images (the logs' ``train_samples`` for ResNet-50).
IMAGENET_TRAIN_IMAGES = 1_281_167


@dataclass(frozen=True)
class Published:
    """One system's MLPerf Training v1.1 result: ``minutes`` to train (MLPerf's mean),
    ``items`` trained on (images or samples, the logs' mean), the configuration, and
    ``fastest_items_per_s``: the logs' throughput over their fastest epoch (ResNet-50) or
    block of samples between evaluations (BERT-Large), the median of the runs."""

    system: str
    replicas: int
    ipus_per_replica: int
    micro_batch: int
    gradient_accumulation: int
    minutes: float
    items: float
    fastest_items_per_s: float

    @property
    def host_side_s(self) -> float:
        """Seconds of the published time that training at the fastest throughput does not
        account for: ``minutes * 60 - items / fastest_items_per_s`` (the host's work:
        checkpoints, evaluations, start-up; not the POD's)."""
        return self.minutes * 60 - self.items / self.fastest_items_per_s


RESNET50 = {
    "POD16": Published("POD16", 16, 1, 20, 10, 28.335, 38 * IMAGENET_TRAIN_IMAGES, 29_657),
    "POD64": Published("POD64", 64, 1, 20, 3, 8.502, 38 * IMAGENET_TRAIN_IMAGES, 108_312),
    "POD128": Published("POD128", 128, 1, 20, 2, 5.671, 41 * IMAGENET_TRAIN_IMAGES, 186_000),
    "POD256": Published("POD256", 256, 1, 20, 2, 3.792, 45 * IMAGENET_TRAIN_IMAGES, 351_005),
}
#: (BERT-Large's blocks: 175,000 samples on IPU-POD16 and 64, 200,000 on IPU-POD128, the last
#: one of a run, cut short at the target, left out.)
BERT_LARGE = {
    "POD16": Published("POD16", 4, 4, 2, 192, 32.697, 2_521_624, 1_545),
    "POD64": Published("POD64", 8, 8, 2, 96, 10.564, 2_486_549, 4_909),
    "POD128": Published("POD128", 16, 8, 2, 96, 6.859, 3_424_449, 9_420),
}
#: The five ratios of time to train: (model, slower system, faster system).
RATIOS = (("resnet50", "POD16", "POD64"), ("resnet50", "POD64", "POD128"),
          ("resnet50", "POD64", "POD256"), ("bert-large", "POD16", "POD64"),
          ("bert-large", "POD64", "POD128"))


def ratios(samples_per_s: dict[tuple[str, str], float], *, host_side: bool = False
           ) -> list[tuple]:
    """The five ratios of :data:`RATIOS`: ``(model, slower, faster, published, predicted,
    predicted from throughput alone)``, where ``samples_per_s[(model, system)]`` is the
    model's predicted samples per second there. Predicted: the ratio of ``items /
    samples_per_s`` (``host_side``: plus each system's :attr:`Published.host_side_s`); from
    throughput alone: of ``1 / samples_per_s`` (as if every size trained on the same data)."""
    tables = {"resnet50": RESNET50, "bert-large": BERT_LARGE}
    out = []
    for model, slow, fast in RATIOS:
        a, b = tables[model][slow], tables[model][fast]
        rate_a, rate_b = samples_per_s[(model, slow)], samples_per_s[(model, fast)]
        time_a = a.items / rate_a + (a.host_side_s if host_side else 0.0)
        time_b = b.items / rate_b + (b.host_side_s if host_side else 0.0)
        out.append((model, slow, fast, a.minutes / b.minutes, time_a / time_b, rate_b / rate_a))
    return out


def ratios_with_host_side(samples_per_s: dict[tuple[str, str], float]) -> list[tuple]:
    """:func:`ratios` with each system's :attr:`Published.host_side_s` (the logs' host-side
    seconds, taken as they are, as the data per run is) added to the predicted time to
    train."""
    return ratios(samples_per_s, host_side=True)


def table(rows: list[tuple]) -> str:
    """:func:`ratios`' rows as text: published, predicted, predicted / published, and the
    same from throughput alone."""
    lines = [f"{'time to train, MLPerf v1.1':<30}{'published':>10}{'predicted':>10}{'ratio':>8}"
             f"{'thr. only':>11}{'ratio':>8}"]
    for model, slow, fast, published, predicted, throughput in rows:
        lines.append(f"{model + ' ' + slow + '/' + fast:<30}{published:>10.3f}"
                     f"{predicted:>10.3f}{predicted / published:>8.2f}{throughput:>11.3f}"
                     f"{throughput / published:>8.2f}")
    return "\n".join(lines)


def predicted_rates(cards: dict[str, ModelCard], efficiency: float | None = None
                    ) -> dict[tuple[str, str], float]:
    """``(model, system) -> samples/s`` that :func:`collectives.step_model.predict` gives
    ``cards[model]`` (``"resnet50"``, ``"bert-large"``) at each published configuration."""
    tables = {"resnet50": RESNET50, "bert-large": BERT_LARGE}
    out = {}
    for model, card in cards.items():
        for system, p in tables[model].items():
            config = StepConfig(system, p.replicas, ipus_per_replica=p.ipus_per_replica,
                                micro_batch=p.micro_batch,
                                gradient_accumulation=p.gradient_accumulation)
            out[(model, system)] = predict(card, config, efficiency).samples_per_s
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--efficiency", type=float, default=None,
                        help="fraction of peak FLOP/s sustained (default: the model's 0.5)")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from size_bert_large import CARD as BERT_CARD
    from size_resnet50 import CARD as RESNET_CARD
    rates = predicted_rates({"resnet50": RESNET_CARD, "bert-large": BERT_CARD},
                            args.efficiency)
    print("MLPerf Training v1.1, Graphcore, closed division: the ratios of time to train between "
          "POD sizes\n(predicted: the logs' data per run over ipupod's samples/s from "
          "examples/size_resnet50.py's and size_bert_large.py's cards)\n")
    for (model, system), rate in rates.items():
        p = (RESNET50 if model == "resnet50" else BERT_LARGE)[system]
        print(f"  {model:<11}{system:<7} predicted {rate:>11,.0f}/s, "
              f"{p.items / rate / 60:6.2f} min to train; published {p.minutes:6.2f} min")
    print()
    print(table(ratios(rates)))
    print("\nwith the logs' host-side seconds added to each predicted time (ResNet-50 "
          + ", ".join(f"{p.host_side_s:.1f}" for p in RESNET50.values()) + "; BERT-Large "
          + ", ".join(f"{p.host_side_s:.1f}" for p in BERT_LARGE.values())
          + "): the POD's part predicted, the host's as published\n")
    print(table(ratios_with_host_side(rates)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
