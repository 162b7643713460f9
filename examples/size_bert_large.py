"""Size BERT-Large pre-training on IPU-POD16, POD64 and POD128 (and POD256 by what_if)
without running it.

    python examples/size_bert_large.py

Prints :func:`collectives.step_model.predict`'s step table for each configuration. Inputs
only (issue 13); the hardware numbers come from the datasheets through :mod:`ipu_node.chips`
and the collective cost model, nothing is fitted to a measured throughput:

* 335,141,888 parameters, fp16 gradients, 1.02 TFLOP of training compute per 512-token pack
  of 2 samples, micro-batch 2 packs, GC200;
* optimizer state: LAMB with fp32 master weights and two fp32 moments, 12 bytes per
  parameter, in Streaming Memory (``offload_weight_update_variables``), read and written
  back once per step;
* replicas x IPUs per replica / gradient accumulation / instances: 4x4/192/1 (POD16),
  8x8/96/1 (POD64), 16x8/96/2 (POD128). The issue gives no POD256 configuration; the last
  table is :func:`~collectives.step_model.what_if` of the POD128 one with 32 replicas and 4
  instances, labelled as such.

Assumptions (also printed under each table):

* the layers are split evenly over the pipeline stages (``stage_shares`` equal): each IPU
  computes and holds ``1/ipus_per_replica`` of the model; a grouped pipeline's ramp-up and
  ramp-down cost ``stages - 1`` micro-batches of the slowest stage;
* compute at 0.5 of the GC200's FP16.16 peak (:data:`~collectives.step_model.DEFAULT_EFFICIENCY`,
  an ipupod assumption; ``--efficiency`` changes it);
* each stage's gradient share is all-reduced on its own IPU, all stages at once, after the
  last micro-batch; the weight update follows, not overlapped;
* the Streaming Memory bandwidth (51.2 GB/s per IPU-Machine, shared by its 4 IPUs) and the
  link latencies are ipupod assumptions; the input tokens are too small to matter and the
  card gives none.
"""

from __future__ import annotations

import argparse

from collectives.step_model import ModelCard, StepConfig, predict, what_if

CARD = ModelCard(params=335_141_888, flops_per_item=1.02e12, grad_dtype="float16",
                 samples_per_item=2, optimizer_state_bytes_per_param=12,
                 optimizer_state_in="streaming")
#: (system, replicas, IPUs per replica, gradient accumulation, instances), micro-batch 2.
CONFIGS = (("POD16", 4, 4, 192, 1), ("POD64", 8, 8, 96, 1), ("POD128", 16, 8, 96, 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--efficiency", type=float, default=None,
                        help="fraction of peak FLOP/s sustained (default: the model's 0.5)")
    args = parser.parse_args(argv)
    print("BERT-Large pre-training step, modelled (datasheet numbers, nothing fitted)\n")
    config = None
    for system, replicas, ipus, accumulation, instances in CONFIGS:
        config = StepConfig(system, replicas, ipus_per_replica=ipus, micro_batch=2,
                            gradient_accumulation=accumulation, instances=instances)
        print(predict(CARD, config, efficiency=args.efficiency).table(), end="\n\n")
    print("what_if: the POD128 configuration on a POD256 (32 x 8 IPUs, 4 instances)")
    print(what_if(CARD, config, efficiency=args.efficiency, system="POD256", replicas=32,
                  instances=4).table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
