"""Each instance writes the IPU ids it attached to <dir>/instance_<i>.json."""
import json
import os
import sys

import ipu_node
from poprun import popdist

cfg = ipu_node.IPUConfig()
popdist.set_ipu_config(cfg)
system = cfg.configure_ipu_system()
ipus = [ipu.id for ipu in system.devices[0].ipus]
with open(os.path.join(sys.argv[1], f"instance_{popdist.getInstanceIndex()}.json"), "w") as f:
    json.dump(ipus, f)
