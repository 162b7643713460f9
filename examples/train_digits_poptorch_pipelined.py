"""The PopTorch digits program of ``train_digits_poptorch.py`` with its network cut over the
two IPUs of each replica: a pipeline, data-parallel over the replicas of an ipupod job.

    poprun -n 2 --num-replicas 2 --ipus-per-replica 2 python examples/train_digits_poptorch_pipelined.py
    python examples/train_digits_poptorch_pipelined.py        # 1 replica of 2 IPUs

``poptorch.BeginBlock`` puts the two convolution blocks on IPU 0 and the dense layers (with
the loss) on IPU 1; ``PipelinedExecution`` (the default strategy) runs each step's
``--gradient-accumulation`` micro-batches through PopART's pipeline: 2 stages, so 3 in
training, and the gradient accumulation must be at least 3. Each instance's replica computes
pass by pass in the schedule's order, the replicas' gradients are averaged over the job once
per step, and the model's own FLOPs and activations give the modelled time and memory printed
at the end: the modelled step time, the pipeline's bubble and the memory of each IPU
(``model.modelReport()``). The test set is read whole by every instance with a pipelined
``inferenceModel`` (``deviceIterations`` at least the 2 stages). The last line printed is
``test_accuracy=<float>``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import popdist
import popdist.poptorch
import poptorch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits_poptorch import (Network, TrainingModelWithLoss, accuracy,  # noqa: E402
                                   digits)

IPUS_PER_REPLICA = 2


def options(device_iterations: int) -> poptorch.Options:
    """This instance's options: poprun's replicas and IPUs under poprun, else 1 replica."""
    if popdist.isPopdistEnvSet():
        return popdist.poptorch.Options(ipus_per_replica=IPUS_PER_REPLICA) \
            .deviceIterations(device_iterations)
    return poptorch.Options().deviceIterations(device_iterations)


def cut(model: Network) -> Network:
    """The convolutions on IPU 0, the dense layers (and the loss after them) on IPU 1."""
    poptorch.BeginBlock(model.layer1, "convolutions", ipu_id=0)
    poptorch.BeginBlock(model.layer3, "dense", ipu_id=1)
    return model


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description="digits training in PopTorch, pipelined")
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch (default: 8)")
    parser.add_argument("--gradient-accumulation", type=int, default=4,
                        help="micro-batches per step, at least 3 (default: 4)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--device-iterations", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="data split and shuffle seed")
    args = parser.parse_args(argv)

    opts = options(args.device_iterations).randomSeed(args.seed)
    opts.Training.gradientAccumulation(args.gradient_accumulation)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    train_set, test_set = digits(args.seed)
    training_data = poptorch.DataLoader(opts, train_set, batch_size=args.batch_size,
                                        shuffle=True, drop_last=True)
    test_opts = options(10)
    test_data = poptorch.DataLoader(test_opts, test_set, batch_size=args.batch_size,
                                    shuffle=False, drop_last=True,
                                    auto_distributed_partitioning=False)

    torch.manual_seed(args.seed)
    model = cut(Network())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    training_model = poptorch.trainingModel(TrainingModelWithLoss(model), opts,
                                            optimizer=optimizer)
    first = popdist.getInstanceIndex() == 0
    for epoch in range(args.epochs):
        for data, labels in training_data:
            _, losses = training_model(data, labels)
        if first:
            print(f"epoch {epoch + 1}/{args.epochs} loss={float(losses.mean()):.4f}",
                  flush=True)
    report = training_model.modelReport()
    training_model.detachFromDevice()

    model.eval()
    inference_model = poptorch.inferenceModel(model, test_opts)
    sum_acc = 0.0
    with torch.no_grad():
        for data, labels in test_data:
            sum_acc += accuracy(inference_model(data), labels)
    test_accuracy = sum_acc / len(test_data)
    if first:
        print(f"modelled step time: {report.step_s * 1e3:.4f} ms per step "
              f"({report.gradient_accumulation} micro-batches of {report.micro_batch}, "
              f"{report.global_replicas} replica(s) x {report.ipus_per_replica} IPUs); bubble "
              f"fraction {report.bubble_fraction:.3f}")
        for ipu, memory in report.memory.items():
            print(f"memory of IPU {ipu}: {memory['total'] / 1e6:.3f} MB of "
                  f"{memory['capacity'] / 1e6:.1f} MB (parameters "
                  f"{memory['parameters'] / 1e3:.1f} kB, optimizer state "
                  f"{memory['optimizer_state'] / 1e3:.1f} kB, accumulators "
                  f"{memory['accumulators'] / 1e3:.1f} kB, activations "
                  f"{memory['activations'] / 1e3:.1f} kB, code and exchange "
                  f"{memory['code_and_exchange'] / 1e6:.1f} MB)")
        print("Accuracy on test set: {:.2f}%".format(100 * test_accuracy))
        print(f"test_accuracy={test_accuracy:.4f}", flush=True)
    return test_accuracy


if __name__ == "__main__":
    main()
