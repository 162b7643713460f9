"""Every replica makes invalid collective calls (caught outside strategy.run), then a valid
one: it must succeed on every instance. Prints ``ERROR <type>`` per caught error and
``SUM <values>`` at the end."""
import numpy as np

import collectives as C
import ipu_node
from collectives.strategies import IPUMultiReplicaStrategy
from poprun import popdist

cfg = ipu_node.IPUConfig()
popdist.set_ipu_config(cfg)
cfg.configure_ipu_system()
strategy = IPUMultiReplicaStrategy()
strategy.run(lambda: C.cross_replica_sum(np.ones(3)))
for bad in (lambda: C.cross_replica_sum({"a": np.ones(2), "b": np.ones(2, np.int8)}),
            lambda: C.reduce_scatter([np.ones(4), np.ones((2, 2))]),
            lambda: C.all_gather(np.ones(2), group="ALL"),
            lambda: C.cross_replica_sum(np.ones(2), replica_group_size=3)):
    try:
        strategy.run(bad)
    except (TypeError, ValueError) as exc:
        print("ERROR", type(exc).__name__, flush=True)
out = strategy.run(lambda: C.cross_replica_sum([np.ones(2), np.float32(C.replication_index())]))
print("SUM", out[0][0].tolist(), float(out[0][1]), flush=True)
