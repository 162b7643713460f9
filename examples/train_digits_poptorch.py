"""The seeds' PopTorch MNIST program (seed 001:1399-1487), on scikit-learn's handwritten
digits (8x8, nothing downloaded) instead of MNIST, run on ipupod's emulated IPUs.

    python examples/train_digits_poptorch.py
    poprun -n 2 --num-replicas 4 python examples/train_digits_poptorch.py

The program is the seed's: ``poptorch.Options().deviceIterations(...)``, ``poptorch.
DataLoader``, ``poptorch.trainingModel`` with ``torch.optim.SGD``, ``detachFromDevice``, then
``poptorch.inferenceModel`` for the test accuracy. What differs, and why:

* the data: digits (1797 images, 80/20 split, normalised) instead of MNIST; the seed does
  not show its ``Network``: this one is Graphcore's MNIST example network (two conv/
  max-pool/ReLU blocks, a hidden layer with dropout 0.5) with padded convolutions so that
  8x8 images fit, returning logits to ``CrossEntropyLoss`` (the example's softmax before
  the loss trained too slowly to be reliable here);
* ``--device-iterations`` defaults to 10 (the seed's 50 would ask for more images per call
  than the digits' training set holds at 4 replicas) and ``--lr`` to 0.1 (the seed's 0.05
  reaches 0.95-0.99 at 4 replicas, depending on the seed: 10 epochs are 40 steps each there);
* under poprun the options are ``popdist.poptorch.Options()`` (the instance's replicas and
  its place in the job), with ``randomSeed`` so that every instance shuffles alike (PopTorch
  requires it when a shuffled data set is split over processes);
* ``model.eval()`` before the test (the seed's network has dropout; PopTorch compiles the
  inference model in the mode the module is in), and the test set is read whole by every
  instance (``auto_distributed_partitioning=False``) so that instance 0's accuracy is the
  job's. The last line printed is ``test_accuracy=<float>``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn

import popdist
import popdist.poptorch
import poptorch


class Block(nn.Module):
    def __init__(self, in_channels, num_filters, kernel_size, pool_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_filters, kernel_size=kernel_size, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=pool_size)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.pool(self.conv(x)))


class Network(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = Block(1, 32, 3, 2)       # 8x8 -> 4x4
        self.layer2 = Block(32, 64, 3, 2)      # 4x4 -> 2x2
        self.layer3 = nn.Linear(256, 128)
        self.layer3_act = nn.ReLU()
        self.layer3_dropout = torch.nn.Dropout(0.5)
        self.layer4 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.layer2(self.layer1(x))
        x = x.view(-1, 256)
        x = self.layer3_act(self.layer3(x))
        return self.layer4(self.layer3_dropout(x))  # logits, for CrossEntropyLoss


class TrainingModelWithLoss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, args, loss_inputs=None):
        output = self.model(args)
        if loss_inputs is None:
            return output
        return output, self.loss(output, loss_inputs)


def accuracy(predictions, labels):
    _, ind = torch.max(predictions, 1)
    # provide labels only for samples, where prediction is available (during the training,
    # not every samples prediction is returned for efficiency reasons)
    labels = labels[-predictions.size()[0]:]
    return torch.sum(torch.eq(ind, labels)).item() / labels.size(0)


def digits(seed: int):
    """Digits as [N, 1, 8, 8] float32, normalised to mean 0 and deviation 1 over the data
    set (as the MNIST example's Normalize transform), a fixed 80/20 split."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x = torch.tensor(x, dtype=torch.float32)[order].reshape(-1, 1, 8, 8)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(y, dtype=torch.long)[order]
    n_test = len(x) // 5
    return (torch.utils.data.TensorDataset(x[n_test:], y[n_test:]),
            torch.utils.data.TensorDataset(x[:n_test], y[:n_test]))


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description="digits training in PopTorch")
    parser.add_argument("--batch-size", type=int, default=8,
                        help="batch size for training (default: 8)")
    parser.add_argument("--test-batch-size", type=int, default=8,
                        help="batch size for testing (default: 8)")
    parser.add_argument("--epochs", type=int, default=10,
                        help="number of epochs to train (default: 10)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate (default: 0.1)")
    parser.add_argument("--device-iterations", type=int, default=10,
                        help="device iterations (default: 10)")
    parser.add_argument("--seed", type=int, default=0, help="data split and shuffle seed")
    args = parser.parse_args(argv)

    if popdist.isPopdistEnvSet():
        opts = popdist.poptorch.Options()
    else:
        opts = poptorch.Options()
    opts.deviceIterations(args.device_iterations).randomSeed(args.seed)
    train_set, test_set = digits(args.seed)
    training_data = poptorch.DataLoader(opts, train_set, batch_size=args.batch_size,
                                        shuffle=True, drop_last=True)
    test_data = poptorch.DataLoader(opts, test_set, batch_size=args.test_batch_size,
                                    shuffle=True, drop_last=True,
                                    auto_distributed_partitioning=False)

    model = Network()
    training_model = TrainingModelWithLoss(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    training_model = poptorch.trainingModel(training_model, opts, optimizer=optimizer)
    inference_model = poptorch.inferenceModel(model)

    first = popdist.getInstanceIndex() == 0
    for epoch in range(args.epochs):
        for data, labels in training_data:
            preds, losses = training_model(data, labels)
        if first:
            print(f"epoch {epoch + 1}/{args.epochs} loss={float(losses.mean()):.4f}",
                  flush=True)

    # Detach the training model so that the same IPU could be used for validation
    training_model.detachFromDevice()
    model.eval()

    sum_acc = 0.0
    with torch.no_grad():
        for data, labels in test_data:
            output = inference_model(data)
            sum_acc += accuracy(output, labels)
    test_accuracy = sum_acc / len(test_data)
    if first:
        print("Accuracy on test set: {:.2f}%".format(100 * test_accuracy))
        print(f"test_accuracy={test_accuracy:.4f}", flush=True)
    return test_accuracy


if __name__ == "__main__":
    main()
