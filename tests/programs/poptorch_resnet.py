"""A BatchNorm ResNet trained the way Graphcore's CNN application trains one (default options:
``broadcastBuffers(True)``), whose weights and running statistics must be the same bits at
every layout of its 4 replicas: ``python -m tests.programs.poptorch_resnet`` (one process,
``replicationFactor(4)``) or ``poprun -n 2 --num-replicas 4 python -m
tests.programs.poptorch_resnet`` (popdist.poptorch.Options).

Every replica gets the same micro-batches at every layout (the program builds the global
batch and each instance cuts out its replicas' rows). Each instance prints ``instance=<i>
digest=<sha256 of its host state_dict>``: its host copy holds its first local replica's
running statistics, so instance 0's digest is the one-process run's.

With the argument ``hvd``, the program also uses Horovod beside poptorch as the CNN and BERT
applications do: ``hvd.init()`` and ``broadcast_parameters`` before training, the metrics
combined with ``allreduce(average=True)``, ``grouped_allreduce(op=hvd.Sum)``, ``allgather``
and ``allgather_object``; it prints ``hvd rank=<r> size=<n> ...`` with what they gave.
"""

import hashlib
import sys

import torch

import popdist
import popdist.poptorch
import poptorch
from tests.poptorch_models import WithLoss, bn_resnet

REPLICAS, DI, B = 4, 2, 3


def main(use_hvd: bool) -> None:
    if use_hvd:
        import horovod.torch as hvd   # ipupod's (poptorch._horovod_torch) without Horovod
        hvd.init()
    if popdist.isPopdistEnvSet():
        opts = popdist.poptorch.Options()
    else:
        opts = poptorch.Options().replicationFactor(REPLICAS)
    opts.deviceIterations(DI).randomSeed(7)
    local, offset = opts.replication_factor, popdist.getReplicaIndexOffset()
    net = bn_resnet(seed=0)
    if use_hvd:
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    model = poptorch.trainingModel(WithLoss(net), opts,
                                   torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x = torch.randn(DI, REPLICAS, B, 3, 6, 6, generator=data)
        y = torch.randint(0, 3, (DI, REPLICAS, B), generator=data)
        mine = slice(offset, offset + local)
        _, loss = model(x[:, mine].reshape(-1, 3, 6, 6), y[:, mine].reshape(-1))
        losses.append(loss)
    digest = hashlib.sha256()
    for name, tensor in net.state_dict().items():
        digest.update(name.encode() + tensor.numpy().tobytes())
    print(f"instance={popdist.getInstanceIndex()} digest={digest.hexdigest()} "
          f"tracked={int(net[1].num_batches_tracked)}", flush=True)
    if use_hvd:
        mean = hvd.allreduce(losses[-1].mean(), average=True, name="loss")
        total, count = hvd.grouped_allreduce([losses[-1].sum(), torch.tensor(float(local))],
                                             op=hvd.Sum)
        gathered = hvd.allgather(losses[-1].reshape(-1))
        objects = hvd.allgather_object({"rank": hvd.rank(), "replicas": local})
        print(f"hvd rank={hvd.rank()} size={hvd.size()} mean={float(mean):.6f} "
              f"sum={float(total):.6f} replicas={int(count)} gathered={gathered.numel()} "
              f"objects={[o['rank'] for o in objects]}", flush=True)


if __name__ == "__main__":
    main("hvd" in sys.argv[1:])
