"""A program for the never-hang tests: ``safety.py MODE FAILING [MARKER]``.

The instance ``FAILING`` (``IPUPOD_INSTANCE_INDEX``) does MODE at once, before any collective:
``raise`` (RuntimeError), ``exit3`` (sys.exit(3)), ``_exit3`` (os._exit(3): no Python
clean-up, no error file), ``kill`` (SIGKILL itself); ``attach``
makes every instance attach its IPUs first. Every other instance prints ``ready`` and
sleeps; with MODE ``ignore`` every instance ignores SIGTERM and SIGINT, prints ``ready`` and
sleeps. MARKER is only there to find the processes.
"""

import os
import signal
import sys
import time

mode, failing = sys.argv[1], int(sys.argv[2])
me = int(os.environ.get("IPUPOD_INSTANCE_INDEX", "0"))
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if mode == "attach":
    import ipu_node
    from poprun import popdist
    cfg = ipu_node.IPUConfig()
    popdist.set_ipu_config(cfg)
    cfg.configure_ipu_system()
if me == failing:
    if mode == "raise":
        raise RuntimeError("deliberate failure before the first collective")
    if mode == "exit3":
        sys.exit(3)
    if mode == "_exit3":
        os._exit(3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
print("ready", flush=True)
time.sleep(300)
