"""The small chain model of the PopTorch pipeline tests and how they annotate and compile it."""

from __future__ import annotations

import torch

import poptorch

F = torch.nn.functional


class Chain(torch.nn.Module):
    """``n`` Linear(w, w) + tanh layers, then a classifier; ``forward(x, y) -> (out, loss)``."""

    def __init__(self, n: int = 4, width: int = 8, classes: int = 3, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        out = self.head(x)
        return out, F.cross_entropy(out, y)


def annotate(net: Chain, ipus: list[int]) -> Chain:
    """Layer i begins a block on IPU ipus[i] (the head stays with the last layer)."""
    for i, (layer, ipu) in enumerate(zip(net.layers, ipus)):
        poptorch.BeginBlock(layer, f"L{i}", ipu_id=ipu)
    return net


def training(net, G=1, di=1, R=1, strategy=None, lr=0.1, **opts_kw):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(R)
    opts.Training.gradientAccumulation(G)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    for k, v in opts_kw.items():
        getattr(opts, k)(v)
    return poptorch.trainingModel(net, opts, optimizer=torch.optim.SGD(net.parameters(), lr=lr))


def data(rows: int, width: int = 8, classes: int = 3, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=g), torch.randint(0, classes, (rows,), generator=g)
