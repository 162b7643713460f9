"""Shared by the TF layout programs: a PopDistStrategy over ``replicas`` replicas, one
instance alone (``python prog.py``) or the job's under poprun."""

import popdist
import popdist.tensorflow
from tensorflow.python import ipu


def popdist_strategy(replicas: int):
    """Configure the IPU system (poprun's layout, or ``replicas`` IPUs alone) and return
    ``(PopDistStrategy, global index of this instance's first replica)``."""
    cfg = ipu.config.IPUConfig()
    if popdist.isPopdistEnvSet():
        popdist.tensorflow.set_ipu_config(cfg, ipus_per_replica=1)
    else:
        cfg.auto_select_ipus = replicas
    cfg.configure_ipu_system()
    offset = popdist.getReplicaIndexOffset() if popdist.isPopdistEnvSet() else 0
    return ipu.distributed.PopDistStrategy(), offset
