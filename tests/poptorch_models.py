"""Small PyTorch models and the plain-PyTorch oracle of a PopTorch training call."""

from __future__ import annotations

import copy

import torch

from poptorch._threads import threads_per_replica


class WithLoss(torch.nn.Module):
    """``net`` and a loss: ``forward(x, y) -> (output, loss)``."""

    def __init__(self, net: torch.nn.Module, loss=torch.nn.functional.cross_entropy):
        super().__init__()
        self.net, self.loss = net, loss

    def forward(self, x, y):
        out = self.net(x)
        return out, self.loss(out, y)


def mlp(n_in: int = 6, hidden: int = 16, n_out: int = 3, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, n_out))


def tree_sum(items: list):
    """GCL's canonical order: a pairwise tree split at the largest power of two below n."""
    if len(items) == 1:
        return items[0]
    p = 1 << ((len(items) - 1).bit_length() - 1)
    return tree_sum(items[:p]) + tree_sum(items[p:])


def plain_call(net: torch.nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, di: int,
               G: int, R: int, mean: bool = True, loss=torch.nn.functional.cross_entropy
               ) -> list[torch.Tensor]:
    """One PopTorch training call done by hand: for each of ``di`` steps, every replica r
    runs its G micro-batches (rows laid out [di, G, R, B]) from the current weights, the
    per-replica gradients are summed in the canonical tree order, divided by G x R (Mean),
    and ``optimizer`` steps. Returns the last micro-batch loss of each replica (Final)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads_per_replica(R))
    xs = x.reshape(di, G, R, -1, *x.shape[1:])
    ys = y.reshape(di, G, R, -1, *y.shape[1:])
    try:
        for d in range(di):
            grads, last = [], []
            for r in range(R):
                replica = copy.deepcopy(net)
                for g in range(G):
                    value = loss(replica(xs[d, g, r].clone()), ys[d, g, r].clone())
                    value.backward()
                grads.append([p.grad for p in replica.parameters()])
                last.append(value.detach())
            for i, p in enumerate(net.parameters()):
                total = tree_sum([g[i] for g in grads])
                p.grad = total / (G * R) if mean else total
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(previous)
    return last


class _Residual(torch.nn.Module):
    """A ResNet basic block: conv-BN-ReLU-conv-BN plus the identity, then ReLU."""

    def __init__(self, channels: int):
        super().__init__()
        conv = lambda: torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)  # noqa: E731
        self.conv1, self.bn1 = conv(), torch.nn.BatchNorm2d(channels)
        self.conv2, self.bn2 = conv(), torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


def bn_resnet(channels: int = 4, classes: int = 3, seed: int = 0) -> torch.nn.Module:
    """A small BatchNorm ResNet on [N, 3, H, W] images: stem (conv, BN, ReLU), one basic
    block, global average pooling, a linear classifier."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, channels, 3, padding=1, bias=False), torch.nn.BatchNorm2d(channels),
        torch.nn.ReLU(), _Residual(channels), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(channels, classes))
