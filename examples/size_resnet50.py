"""Size ResNet-50 v1.5 training on IPU-POD16, POD64, POD128 and POD256 without running it.

    python examples/size_resnet50.py

Prints :func:`collectives.step_model.predict`'s step table for each configuration. Inputs
only (issue 13); every hardware number comes from the datasheets through
:mod:`ipu_node.chips` and the collective cost model, nothing is fitted to a measured
throughput:

* 25,557,032 parameters, fp16 gradients, 24.5 GFLOP of training compute per 224x224 image
  (3 x 8.18 GFLOP forward), 150,528 input bytes per image (224 x 224 x 3 uint8), one GC200
  IPU per replica, micro-batch 20;
* replicas / gradient accumulation / instances: 16/10/8 (POD16), 64/3/32 (POD64),
  128/2/64 (POD128), 256/2/128 (POD256).

Assumptions (also printed under each table):

* compute runs at :data:`~collectives.step_model.DEFAULT_EFFICIENCY` (0.5) of the GC200's
  FP16.16 peak (249.7 TFLOPS, IPU-POD64 datasheet over 64 IPUs): an ipupod assumption;
  ``--efficiency`` changes it;
* host I/O (the images over each IPU-Machine's 100 GbE, shared by its 4 IPUs) overlaps
  compute: the infeed prefetches; only what compute cannot hide is charged;
* the gradient all-reduce (the cheapest schedule of the cost model: on POD128/POD256
  reduce-scatter inside each POD64, all-reduce across over the GW-Links, all-gather) and the
  weight update (SGD-class, optimizer state in SRAM) run once per step after the last
  micro-batch, not overlapped;
* link latencies are ipupod assumptions (no source gives them); the number of host instances
  changes nothing the POD does.
"""

from __future__ import annotations

import argparse

from collectives.step_model import ModelCard, StepConfig, predict

CARD = ModelCard(params=25_557_032, flops_per_item=3 * 8.18e9, grad_dtype="float16",
                 input_bytes_per_item=224 * 224 * 3)
#: (system, replicas, gradient accumulation, instances), micro-batch 20, 1 IPU per replica.
CONFIGS = (("POD16", 16, 10, 8), ("POD64", 64, 3, 32), ("POD128", 128, 2, 64),
           ("POD256", 256, 2, 128))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--efficiency", type=float, default=None,
                        help="fraction of peak FLOP/s sustained (default: the model's 0.5)")
    parser.add_argument("--systems", default=",".join(c[0] for c in CONFIGS),
                        help="comma-separated subset of POD16,POD64,POD128,POD256")
    args = parser.parse_args(argv)
    wanted = {s.strip().upper() for s in args.systems.split(",")}
    print("ResNet-50 v1.5 training step, modelled (datasheet numbers, nothing fitted)\n")
    for system, replicas, accumulation, instances in CONFIGS:
        if system not in wanted:
            continue
        config = StepConfig(system, replicas, micro_batch=20,
                            gradient_accumulation=accumulation, instances=instances)
        print(predict(CARD, config, efficiency=args.efficiency).table(), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
