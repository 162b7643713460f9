"""Error files: an instance that fails writes why, so the launcher can name the root cause.

One JSON file per instance (path in ``IPUPOD_ERROR_FILE``), written atomically.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

from launch.errors import InstanceFailure


def write_error_file(path: str, instance: int, exit_code: int, error: str,
                     traceback_text: str = "", signal: int = 0) -> None:
    """Record a failure at ``path`` (temp file + rename, so a reader never sees half);
    ``signal``: the signal that ended the instance's program, or 0."""
    record = {"instance": instance, "exit_code": exit_code, "signal": signal, "error": error,
              "traceback": traceback_text, "time": time.time(), "pid": os.getpid(),
              "host": socket.gethostname()}
    write_json_atomically(path, record)


def write_json_atomically(path: str, record: dict) -> None:
    """Write ``record`` as JSON at ``path``: a temp file beside it (mode 0600), then a
    rename, so that a reader never sees half of it."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def any_error_file(directory: str) -> bool:
    """Whether an instance of the job has written its error file (``error.<i>.json``) in the
    job's ``directory``; False when the directory cannot be read."""
    try:
        return any(n.startswith("error.") and n.endswith(".json") for n in os.listdir(directory))
    except OSError:
        return False


def read_error_file(path: str) -> InstanceFailure | None:
    """The failure recorded at ``path``, or None when there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            record = json.load(f)
        return InstanceFailure(instance=int(record["instance"]),
                               exit_code=int(record["exit_code"]),
                               signal=int(record.get("signal", 0)),
                               error=str(record.get("error", "")),
                               time=float(record["time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
