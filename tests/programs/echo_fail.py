"""Prints a line per instance on stdout and stderr; instance FAIL_INSTANCE raises, the
others sleep (to be stopped by poprun); writes its PID to PID_DIR/<instance>."""

import os
import sys
import time

instance = int(os.environ["IPUPOD_INSTANCE_INDEX"])
if os.environ.get("PID_DIR"):
    with open(os.path.join(os.environ["PID_DIR"], str(instance)), "w") as f:
        f.write(str(os.getpid()))
print(f"hello from {instance}", flush=True)
print(f"warning from {instance}", file=sys.stderr, flush=True)
if str(instance) == os.environ.get("FAIL_INSTANCE"):
    time.sleep(0.5)
    raise ValueError(f"boom in {instance}")
time.sleep(float(os.environ.get("SLEEP_S", "0")))
