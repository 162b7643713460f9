"""reset_ipu_seed's streams over a poprun job: every local replica draws three numbers from
its stream (own or identical) and the instance writes them, by global replica index, into
``$SEED_STREAMS_OUT/instance-<i>.json``."""

import json
import os
import sys

import ipu_node
from collectives.strategies import PopDistStrategy
from ipu_node import current_replica_context, rand_ops, utils
from poprun import popdist

cfg = ipu_node.IPUConfig()
popdist.set_ipu_config(cfg)
cfg.configure_ipu_system()
strategy = PopDistStrategy()
out = {}
for identical in (False, True):
    utils.reset_ipu_seed(7, experimental_identical_replicas=identical)
    draws = strategy.run(lambda: (current_replica_context().replica_index,
                                  rand_ops.generator().random(3).tolist()))
    out[str(identical)] = {str(r): d for r, d in draws}
path = os.path.join(os.environ["SEED_STREAMS_OUT"],
                    f"instance-{ipu_node.get_system().process_index}.json")
with open(path, "w") as f:
    json.dump(out, f)
sys.exit(0)
