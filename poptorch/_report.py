"""The poptorch part of a run report: every model of the process, its replicas and IPUs,
the SRAM its tensors take, and its options, split into those the emulation acts on and
those it accepts without effect.

With ``IPUPOD_REPORT_DIR`` set (``poprun --report-dir``), it is the ``sections.poptorch``
entry of ``report-<instance>.json`` when the run has a job IPU system (a training model
with more than one replica), and ``poptorch-<instance>.json`` in the same directory in every
case, written at interpreter exit (0600, the directory 0700).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import weakref
from typing import Any

from poptorch import enums

__all__ = ["ACTED_ON", "describe_options", "register_model", "report", "REPORT_DIR_ENV"]

REPORT_DIR_ENV = "IPUPOD_REPORT_DIR"

#: option keys the emulation acts on (any other key that differs from its default is
#: accepted without effect)
ACTED_ON = frozenset({
    "replication_factor", "input_group_size", "input_cgt", "device_iterations",
    "output_mode", "output_return_period", "connection_type", "auto_round_num_ipus",
    "broadcast_buffers", "random_seed", "ipu_id", "model_name", "updatable_named_buffers",
    "gradient_accumulation", "accumulation_and_replication_reduction_type",
    "meanAccumulationAndReplicationReductionStrategy", "num_distributed_processes",
    "distributed_process_id",
})

_models: list[weakref.ref] = []
_lock = threading.Lock()
_state = {"registered": False}


def _plain(value: Any) -> Any:
    if isinstance(value, enum_types()):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def enum_types() -> tuple:
    return tuple(getattr(enums, name) for name in enums.__all__)


def _flat(options) -> dict[str, Any]:
    values = dict(options._values)
    for group in ("Training", "Distributed", "TensorLocations", "Jit"):
        values.update({k: v for k, v in getattr(options, group)._values.items()})
    values.update({f"_Popart.{k}": v for k, v in options._Popart.options.items()})
    return values


def describe_options(options) -> dict[str, dict]:
    """``{"acted_on": {...}, "not_acted_on": {...}}``: the options that differ from a new
    ``Options()`` (plus the process id and count), split by whether the emulation acts on
    them."""
    from poptorch._options import Options
    current, default = _flat(options), _flat(Options())
    out: dict[str, dict] = {"acted_on": {}, "not_acted_on": {}}
    for key, value in current.items():
        if key in ("num_distributed_processes", "distributed_process_id") or \
                default.get(key, object()) != value:
            kind = "acted_on" if key in ACTED_ON else "not_acted_on"
            out[kind][key] = _plain(value)
    return out


def register_model(executor) -> None:
    """Include ``executor`` in the reports (held weakly) and install the exit writer."""
    with _lock:
        _models.append(weakref.ref(executor))
        if _state["registered"]:
            return
        _state["registered"] = True
    try:
        from collectives.run_report import add_report_section
        add_report_section("poptorch", report)
    except ImportError:  # an older collectives without sections
        pass
    if os.environ.get(REPORT_DIR_ENV):
        atexit.register(_write_at_exit)


def report() -> dict:
    """The poptorch section: ``{"models": [...]}`` (module docstring)."""
    with _lock:
        models = [m() for m in _models]
    return {"models": [m._describe() for m in models if m is not None]}


def _write_at_exit() -> None:
    directory = os.environ.get(REPORT_DIR_ENV)
    if not directory:
        return
    try:
        from poprun import popdist
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, f"poptorch-{popdist.getInstanceIndex()}.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(report(), f, indent=1)
    except Exception as exc:  # the run itself succeeded: say why there is no report
        print(f"ipupod: no poptorch report written to {directory}: {exc}", flush=True)
