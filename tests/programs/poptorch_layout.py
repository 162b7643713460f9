"""A PopTorch training job whose weights must be the same bits at every layout of its 4
replicas: ``python poptorch_layout.py`` (replicationFactor(4) in one process), ``poprun -n 2
--num-replicas 4`` or ``poprun -n 4 --num-replicas 4`` (popdist.poptorch.Options).

Every replica gets the same micro-batches at every layout: the program builds the global
batch and each instance cuts out its replicas' rows. Instance 0 prints one line
``digest=<sha256 of the weights and losses>``; every instance prints ``instance=<i>
digest=...`` so the test can check that all instances hold the same weights.
Arguments: the optimizer (sgd, adam, lamb); ``pipelined`` (optional): the network cut over
two IPUs per replica with ``BeginBlock`` (``poprun --ipus-per-replica 2``), 3 micro-batches
per step (PopART's 3 training stages).
"""

import hashlib
import sys

import torch

import poptorch
import popdist
import popdist.poptorch

REPLICAS, DI, G, B = 4, 2, 2, 3


def main(optimizer_name: str, pipelined: bool = False) -> None:
    G = 3 if pipelined else globals()["G"]
    if popdist.isPopdistEnvSet():
        opts = popdist.poptorch.Options()
    else:
        opts = poptorch.Options().replicationFactor(REPLICAS)
    opts.deviceIterations(DI).Training.gradientAccumulation(G)
    local, offset = opts.replication_factor, popdist.getReplicaIndexOffset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.Tanh(),
                              torch.nn.Dropout(0.25), torch.nn.Linear(48, 4))
    if pipelined:
        poptorch.BeginBlock(net[3], "head", ipu_id=1)

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            out = self.net(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    optimizer = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                 "adam": lambda p: poptorch.optim.Adam(p, lr=0.01),
                 "lamb": lambda p: poptorch.optim.LAMB(p, lr=0.01)}[optimizer_name]
    opts.randomSeed(7)
    model = poptorch.trainingModel(WithLoss(), opts, optimizer(net.parameters()))
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x = torch.randn(DI, G, REPLICAS, B, 12, generator=data)
        y = torch.randint(0, 4, (DI, G, REPLICAS, B), generator=data)
        mine = slice(offset, offset + local)
        _, loss = model(x[:, :, mine].reshape(-1, 12), y[:, :, mine].reshape(-1))
        losses.append(loss)
    digest = hashlib.sha256()
    for p in net.parameters():
        digest.update(p.detach().numpy().tobytes())
    weights = digest.hexdigest()
    gathered = torch.stack(losses)  # this instance's replicas' last losses, per call
    print(f"instance={popdist.getInstanceIndex()} digest={weights} "
          f"losses={gathered.numpy().tobytes().hex()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sgd", "pipelined" in sys.argv[2:])
