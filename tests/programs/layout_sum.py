"""cross_replica_sum of fixed random float32 data; instance 0 saves what replica 0 got.

Usage: layout_sum.py OUT.npy  (the number of replicas comes from poprun)
"""
import sys

import numpy as np

import ipu_node
from collectives import cross_replica_sum, replication_index
from collectives.strategies import IPUMultiReplicaStrategy
from poprun import popdist

cfg = ipu_node.IPUConfig()
popdist.set_ipu_config(cfg)
cfg.configure_ipu_system()
strategy = IPUMultiReplicaStrategy()
n = strategy.num_replicas_in_sync
data = np.random.default_rng(1234).standard_normal((n, 4099)).astype(np.float32) * 1e3


def step():
    r = int(replication_index())
    return (cross_replica_sum(data[r]), cross_replica_sum(data[r], replica_group_size=2),
            cross_replica_sum(data[r][:5]))


results = strategy.run(step)
for local in results[1:]:  # every replica of the instance got the same all-replica sums
    assert local[0].tobytes() == results[0][0].tobytes()
    assert local[2].tobytes() == results[0][2].tobytes()
if popdist.getInstanceIndex() == 0:
    np.save(sys.argv[1], np.concatenate([results[0][0], results[0][1], results[0][2]]))
