"""Loops over collectives; instance KILL_INSTANCE SIGKILLs itself after a few, mid-job.

Every instance prints ``PID <instance> <pid>``; a survivor prints ``LOST <instance> <seconds
since the kill> <message>`` when its collective raises, and lets the error end it, and
``SHM <instance> <bytes sent through shared memory>``. ``ELEMENTS`` sets the float32
elements per collective (default 65536); with ``KILL_MID_TRANSFER=1`` the victim's kill comes
from a thread while step 30's collective is moving the bytes.
"""

import os
import signal
import threading
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
x = np.ones(int(os.environ.get("ELEMENTS", 1 << 16)), np.float32)
mid_transfer = os.environ.get("KILL_MID_TRANSFER") == "1"


def kill(delay_s: float = 0.0) -> None:
    time.sleep(delay_s)
    with open(kill_file, "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


for step in range(10_000_000):
    if me == victim and step == 30:
        if not mid_transfer:
            kill()
        threading.Thread(target=kill, args=(0.002,), daemon=True).start()
    try:
        strategy.run(lambda: cross_replica_sum(x))
    except PeerLostError as exc:
        with open(kill_file) as f:
            killed = float(f.read())
        print(f"LOST {me} {time.time() - killed:.2f} {exc}", flush=True)
        print(f"SHM {me} {strategy._engine.transport.shm_bytes_sent}", flush=True)
        raise
