"""Each instance writes its environment and popdist's view of it to <dir>/instance_<i>.json."""
import json
import os
import sys

from poprun import popdist

out = {
    "env": {k: v for k, v in os.environ.items() if k.startswith(("POPDIST_", "IPUPOD_"))},
    "popdist": {name: getattr(popdist, name)() for name in (
        "isPopdistEnvSet", "getNumInstances", "getInstanceIndex", "getNumTotalReplicas",
        "getNumLocalReplicas", "getReplicaIndexOffset", "getNumIpusPerReplica",
        "getLocalInstanceIndex")},
}
with open(os.path.join(sys.argv[1], f"instance_{popdist.getInstanceIndex()}.json"), "w") as f:
    json.dump(out, f)
