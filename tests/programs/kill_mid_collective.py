"""Loops over collectives; instance KILL_INSTANCE SIGKILLs itself after a few, mid-job.

Every instance prints ``PID <instance> <pid>``; a survivor prints ``LOST <instance> <seconds
since the kill> <message>`` when its collective raises, and lets the error end it.
"""

import os
import signal
import time

import numpy as np

from collectives import PeerLostError, cross_replica_sum
from collectives.strategies import IPUMultiReplicaStrategy
from ipu_node import IPUConfig
from poprun import popdist

cfg = IPUConfig()
popdist.set_ipu_config(cfg)
system = cfg.configure_ipu_system()
strategy = IPUMultiReplicaStrategy()
me, victim = system.process_index, int(os.environ.get("KILL_INSTANCE", "1"))
print(f"PID {me} {os.getpid()}", flush=True)
kill_file = os.environ.get("KILL_TIME_FILE", "/tmp/kill-time")
x = np.ones(1 << 16, np.float32)
for step in range(10_000_000):
    if me == victim and step == 30:
        with open(kill_file, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        strategy.run(lambda: cross_replica_sum(x))
    except PeerLostError as exc:
        with open(kill_file) as f:
            killed = float(f.read())
        print(f"LOST {me} {time.time() - killed:.2f} {exc}", flush=True)
        raise
