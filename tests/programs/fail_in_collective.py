"""Instance <argv[1]> raises while the others wait in a collective."""
import sys
import time

import numpy as np

import ipu_node
from collectives import cross_replica_sum
from collectives.strategies import IPUMultiReplicaStrategy
from poprun import popdist

cfg = ipu_node.IPUConfig()
popdist.set_ipu_config(cfg)
cfg.configure_ipu_system()
strategy = IPUMultiReplicaStrategy()
strategy.run(lambda: cross_replica_sum(np.ones(8)))
if popdist.getInstanceIndex() == int(sys.argv[1]):
    time.sleep(0.5)
    raise RuntimeError("deliberate failure of this instance")
strategy.run(lambda: cross_replica_sum(np.ones(8)))
print("unreachable: the failed instance never joined this collective")
