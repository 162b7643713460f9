"""Instance <argv[1]> kills itself with SIGKILL in the middle of the job's collectives."""
import os
import signal
import sys

import numpy as np

import ipu_node
from collectives import cross_replica_sum
from collectives.strategies import IPUMultiReplicaStrategy
from poprun import popdist

cfg = ipu_node.IPUConfig()
popdist.set_ipu_config(cfg)
cfg.configure_ipu_system()
strategy = IPUMultiReplicaStrategy()
for step in range(10_000):
    if step == 20 and popdist.getInstanceIndex() == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    strategy.run(lambda: cross_replica_sum(np.ones(1000)))
print("unreachable")
