"""The poptorch part of a run report: every model of the process, its replicas and IPUs,
the SRAM its tensors take, its options (split into those the emulation acts on and those it
accepts without effect) and ipupod's account of it (``"model"``: its stages, memory per IPU
and modelled step, :class:`poptorch.modelling._model_report.ModelReport`).

Where reports go: ``IPUPOD_REPORT_DIR`` (``poprun --report-dir``), else the ``autoReport``
directory of ``POPLAR_ENGINE_OPTIONS``, else that of a model's ``enableProfiling``. There the
section is the ``sections.poptorch`` entry of ``report-<instance>.json`` when the run has a
job IPU system (a training model with more than one replica in the job: the run report and
trace of :mod:`collectives.run_report` show its IPUs' modelled timelines), and
``poptorch-<instance>.json`` in every case, with ``poptorch-trace-<instance>.json`` (the same
Trace Event Format) for the models whose IPUs have timelines of their own (the free devices of
inference and of one-replica training, pipelined or not), written at interpreter exit (0600, the directory 0700); the
modelled step of each model that ran is printed then.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import weakref
from typing import Any, Callable

from poptorch import enums

__all__ = ["ACTED_ON", "describe_options", "register_model", "report",
           "report_directory", "trace", "summary"]


#: option keys the emulation acts on (any other key that differs from its default is
#: accepted without effect)
ACTED_ON = frozenset({
    "replication_factor", "input_group_size", "input_cgt", "device_iterations",
    "output_mode", "output_return_period", "connection_type", "auto_round_num_ipus",
    "broadcast_buffers", "random_seed", "ipu_id", "model_name", "updatable_named_buffers",
    "gradient_accumulation", "accumulation_and_replication_reduction_type",
    "meanAccumulationAndReplicationReductionStrategy", "num_distributed_processes",
    "distributed_process_id", "location_activation", "location_weight", "location_optimizer",
    "location_accumulator", "_Popart.autoRecomputation",
    "_Popart.instrumentWithHardwareCycleCounter", "_Popart.engineOptions",
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
    from poptorch.options._options import Options
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
        _models.append([weakref.ref(executor), None])
        if _state["registered"]:
            return
        _state["registered"] = True
    from collectives.run_report import add_report_section
    add_report_section("poptorch", report)
    atexit.register(_write_at_exit)


def remember(executor, snapshot: Callable[[], dict]) -> None:
    """What to report of ``executor`` once it is gone: ``snapshot()`` (its entry, with
    the modelled steps it ran; it must not hold the executor)."""
    with _lock:
        for entry in _models:
            if entry[0]() is executor:
                entry[1] = snapshot


def _entries() -> list[tuple[Any, Callable[[], dict] | None]]:
    with _lock:
        return [(ref(), snap) for ref, snap in _models]


def report() -> dict:
    """The poptorch section: ``{"models": [...]}`` (module docstring): the models alive,
    and the compiled ones gone since (``"alive": False``)."""
    out = []
    for model, snapshot in _entries():
        if model is not None:
            out.append({**model._describe(), "alive": True})
        elif snapshot is not None:
            out.append(snapshot())
    return {"models": out}


def _live_models() -> list:
    return [m for m, _ in _entries() if m is not None]


def report_directory() -> str | None:
    """Where the poptorch report goes (module docstring;
    :func:`ipu_node.flags.report_directory` over the live models' ``engineOptions``), or
    None.

    Raises:
        ipu_node.IPUConfigError: ``POPLAR_ENGINE_OPTIONS`` is malformed.
    """
    from ipu_node.flags import report_directory as directory_of
    return directory_of(*(model._options._Popart.options.get("engineOptions") or {}
                          for model in _live_models()))


def _write(path: str, payload: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)


def trace(models: list | None = None) -> dict:
    """The Trace Event Format trace (:func:`collectives.run_report.trace_events`) of the
    models whose IPUs have timelines of their own (free devices): one track per IPU."""
    from collectives.run_report import trace_events
    timeline: dict[str, list] = {}
    system = None
    for model in models if models is not None else _live_models():
        device = model._device
        if device is None or device.job_system is not None:
            continue
        system = device.model.name
        for ipu, tl in device.timelines.items():
            timeline.setdefault(str(ipu), []).extend(e.to_dict() for e in tl.events())
    fake = {"system": system, "ipus": dict.fromkeys(timeline, {}), "timeline": timeline,
            "calls": []}
    return {"traceEvents": trace_events(fake) if timeline else [], "displayTimeUnit": "ms"}


def summary() -> str:
    """The modelled step of every model that ran, alive or gone
    (:meth:`poptorch.modelling._model_report.ModelReport.table`)."""
    tables = []
    for model, snapshot in _entries():
        if model is not None and model._profile is not None and model._modelled["calls"]:
            tables.append(model.modelReport().table())
        elif model is None and snapshot is not None:
            entry = snapshot()
            if entry.get("model") and entry["model"].get("steps"):
                tables.append(entry["table"])
    return "\n".join(tables)


def _write_at_exit() -> None:
    try:
        directory = report_directory()
    except Exception as exc:
        print(f"ipupod: no poptorch report: {exc}", flush=True)
        return
    if not directory:
        return
    try:
        from poprun import popdist
        os.makedirs(directory, mode=0o700, exist_ok=True)
        index = popdist.getInstanceIndex()
        _write(os.path.join(directory, f"poptorch-{index}.json"), report())
        events = trace()
        if events["traceEvents"]:
            _write(os.path.join(directory, f"poptorch-trace-{index}.json"), events)
        text = summary()
        if text:
            print(text, flush=True)
    except Exception as exc:  # the run itself succeeded: say why there is no report
        print(f"ipupod: no poptorch report written to {directory}: {exc}", flush=True)
