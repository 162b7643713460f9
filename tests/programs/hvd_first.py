"""``hvd.init()`` before the IPU system is configured, under poprun, as Graphcore's programs
call it (``python -m tests.programs.hvd_first MODE``):

* ``poptorch``: ``import poptorch, popdist.poptorch``, ``hvd.init()``, then a replicated
  ``trainingModel`` with ``popdist.poptorch.Options`` trains on the system hvd.init()
  configured, and Horovod averages a metric after it;
* ``tf``: ``hvd.init()``, then the program configures the IPU system with popdist (the same
  instances) and keeps calling Horovod;
* ``bare``: no popdist imported: hvd.init() configures the share of the job poprun gave
  the instance (read from poprun's environment by ipu_node), and Horovod sums over it.

Prints ``RESULT <mode> <rank> <size> <value>`` lines.
"""

from __future__ import annotations

import sys

import numpy as np

import collectives.horovod as hvd


def _poptorch() -> None:
    import torch
    import poptorch
    import popdist.poptorch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x, y):
            out = self.net(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    opts = popdist.poptorch.Options(ipus_per_replica=1)
    training = poptorch.trainingModel(WithLoss(), opts,
                                      torch.optim.SGD(model.parameters(), lr=0.1))
    replicas = opts.replication_factor
    x = torch.ones(replicas, 4) * (hvd.rank() + 1)
    y = torch.zeros(replicas, dtype=torch.long)
    _, loss = training(x, y)
    mean = hvd.allreduce(np.array(float(loss.mean())), op=hvd.Average)
    print(f"RESULT poptorch {hvd.rank()} {hvd.size()} {float(mean):.6f}", flush=True)
    training.detachFromDevice()


def _tf() -> None:
    import popdist
    import popdist.tensorflow
    from ipu_node import IPUConfig

    hvd.init()
    first = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
    cfg = IPUConfig()
    popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=1)
    cfg.configure_ipu_system()
    second = hvd.allgather(np.array([hvd.rank()]))
    print(f"RESULT tf {hvd.rank()} {hvd.size()} {first[0]:g} {second.tolist()}", flush=True)


def main(mode: str) -> None:
    if mode == "poptorch":
        _poptorch()
    elif mode == "tf":
        _tf()
    elif mode == "bare":
        hvd.init()
        total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)
        imported = "poprun.popdist" in sys.modules or "popdist" in sys.modules
        print(f"RESULT bare {hvd.rank()} {hvd.size()} {total[0]:g} popdist={imported}",
              flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1])
