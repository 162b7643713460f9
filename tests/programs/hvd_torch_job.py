"""A PyTorch training job that uses Horovod the way Graphcore's PopTorch examples do beside
poptorch (reference poptorch.md §8), with plain torch in place of the IPU model:

    poprun -n N python -m tests.programs.hvd_torch_job OUTDIR STEPS
    python -m tests.programs.hvd_torch_job OUTDIR STEPS        # one instance, whole batch

hvd.init; every rank builds its model from its own seed, then ``broadcast_parameters(
model.state_dict(), root_rank=0)`` before training and a seed made common with
``hvd.broadcast``; ``DistributedOptimizer`` averages the gradients of each rank's shard of
the global batch; the metrics are combined with ``grouped_allreduce(op=Average)`` and
``allgather``. Each instance writes ``checkpoint-instance-<i>.pt`` (state dict and the
metrics) into OUTDIR, as Graphcore's popdist tutorial does for its sync check.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import collectives.horovod as hvd
from poprun import popdist

GLOBAL_BATCH = 8


def main(outdir: str, steps: int) -> int:
    if popdist.isPopdistEnvSet():   # (what poptorch's options do for the IPU system)
        from ipu_node import IPUConfig
        cfg = IPUConfig()
        popdist.set_ipu_config(cfg)
        cfg.configure_ipu_system()
        popdist.init()
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(1000 + r)       # every rank starts elsewhere...
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)   # ...until this
    seed = int(hvd.broadcast(torch.tensor(42 + r), root_rank=0))
    data = torch.Generator().manual_seed(seed)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    losses = []
    shard = GLOBAL_BATCH // n
    for _ in range(steps):
        x = torch.randn(GLOBAL_BATCH, 5, generator=data)
        y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=data)
        x, y = x[r * shard:(r + 1) * shard], y[r * shard:(r + 1) * shard]
        optimizer.zero_grad()
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        accuracy = (out.argmax(1) == y).float().mean()
        loss, accuracy = hvd.grouped_allreduce([loss.detach(), accuracy], op=hvd.Average)
        losses.append(loss.item())
    slowest = torch.max(hvd.allgather(torch.tensor([float(r)]))).item()
    popdist.execute_on_instances({0}, print, f"RESULT loss {losses[-1]:.6f} slowest {slowest}")
    torch.save({"state": model.state_dict(), "losses": losses},
               Path(outdir) / f"checkpoint-instance-{r}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
