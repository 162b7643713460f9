"""The poptorch part of a run report: every model of the process, its replicas and IPUs,
the SRAM its tensors take, its options (split into those the emulation acts on and those it
accepts without effect) and ipupod's account of it (``"model"``: its stages, memory per IPU
and modelled step, :class:`poptorch.modelling._model_report.ModelReport`).

Where reports go: ``IPUPOD_REPORT_DIR`` (``poprun --report-dir``), else the ``autoReport``
directory of ``POPLAR_ENGINE_OPTIONS``, else that of a model's ``enableProfiling``. One report
per instance, ``report-<instance>.json`` with its ``trace-<instance>.json``
(:mod:`collectives.run_report`; ``ipupod-report`` summarises and plots it): when the run has a
job IPU system (a training model with more than one replica in the job, or one Horovod
configured) this section is the ``sections.poptorch`` entry of that system's report; else
poptorch writes the report of its models' own IPUs (:func:`collectives.run_report.
build_report_of_ipus`: inference and one-replica training models, pipelined or not, their
modelled timelines in the trace) at interpreter exit (0600, the directory 0700). The section
gives ``summary`` (each model's :meth:`~poptorch.ModelReport.table`: stages, memory per IPU,
modelled step), which the report's summary prints, and ``breakdown`` (modelled seconds of
each model's step and of its stages' forward and backward passes), which ``ipupod-report``
plots beside the collectives; ``calls``: the application calls that act on nothing here
(:func:`record_call`).
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
           "report_directory", "summary", "record_call", "recorded_calls"]


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
#: the application calls recorded (record_call), in order of their first call: one entry,
#: with its count, per call name, effect and arguments
_calls: dict[str, dict] = {}
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
    """Include ``executor`` in the reports (held weakly) and install the exit writer. The
    report asks the executor, by its methods only: ``_describe()`` (its entry),
    ``_report_table()`` (its table once it ran, else None), ``_own_ipus()`` (``(device,
    global replicas)`` of IPUs of its own, else None) and ``_engine_options()``."""
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


def record_call(name: str, effect: str = "none", **arguments: Any) -> None:
    """Record an application call (``getAnchoredTensor``, ``setAutomaticLossScaling``,
    ``hvd.start_timeline``, ...) in the report's ``calls``: its name, arguments (plain
    values) and what it does here (``effect``: "none" when it is accepted without effect);
    a call made again with the same arguments counts in its entry's ``"count"``."""
    entry = {"call": name, "arguments": _plain(arguments), "effect": effect}
    key = json.dumps(entry, sort_keys=True)
    with _lock:
        _calls.setdefault(key, {**entry, "count": 0})["count"] += 1


def recorded_calls() -> list[dict]:
    """The calls :func:`record_call` recorded so far (copies)."""
    with _lock:
        return [dict(c) for c in _calls.values()]


def report() -> dict:
    """The poptorch section (module docstring): ``{"models": [...], "calls": [...],
    "summary": str, "breakdown": {label: modelled s}}``: the models alive, and the compiled
    ones gone since (``"alive": False``)."""
    out = []
    for model, snapshot in _entries():
        if model is not None:
            out.append({**model._describe(), "alive": True})
        elif snapshot is not None:
            out.append(snapshot())
    breakdown = {}
    for entry in out:
        account = entry.get("model")
        if not account or not account.get("steps"):
            continue
        name = entry["name"]
        breakdown[f"{name}: modelled step"] = account["step_s"]
        for stage in account["stages"]:
            breakdown[f"{name}: stage {stage['stage']} forward"] = stage["forward_s"]
            if entry["training"]:
                breakdown[f"{name}: stage {stage['stage']} backward"] = stage["backward_s"]
    return {"models": out, "calls": recorded_calls(), "summary": summary(),
            "breakdown": breakdown}


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
    return directory_of(*(model._engine_options() for model in _live_models()))


def summary() -> str:
    """The modelled step of every model that ran, alive or gone
    (:meth:`poptorch.modelling._model_report.ModelReport.table`)."""
    tables = []
    for model, snapshot in _entries():
        table = model._report_table() if model is not None else None
        if table is not None:
            tables.append(table)
        elif model is None and snapshot is not None:
            entry = snapshot()
            if entry.get("model") and entry["model"].get("steps"):
                tables.append(entry["table"])
    return "\n".join(tables)


def _report_of_ipus(models: list) -> dict:
    """The run report of the models' own IPUs (no job IPU system)."""
    from collectives.run_report import build_report_of_ipus
    from poprun import popdist
    timelines, peaks, system, replicas, per_replica = {}, {}, None, 1, 1
    for model in models:
        own = model._own_ipus()
        if own is None:
            continue
        device, global_replicas = own
        system = device.model.name
        timelines.update(device.timelines)
        peaks.update({i: m.peak_bytes for i, m in device.memories.items()})
        replicas = max(replicas, global_replicas)
        per_replica = max(per_replica, len(device.replica_ipus[0]))
    return build_report_of_ipus(system, popdist.getInstanceIndex(), popdist.getNumInstances(),
                                replicas, per_replica, timelines, peaks)


def _write_at_exit() -> None:
    """The run's report, unless the job IPU system's report (which has this section) is
    written (module docstring)."""
    from collectives.run_report import report_pending, summary as report_summary, write_payload
    if report_pending():
        return
    try:
        directory = report_directory()
    except Exception as exc:
        print(f"ipupod: no poptorch report: {exc}", flush=True)
        return
    if not directory:
        return
    try:
        report_path, _ = write_payload(directory, _report_of_ipus(_live_models()))
        with open(report_path) as f:
            print(report_summary(json.load(f)) + f"\n  report: {report_path}", flush=True)
    except Exception as exc:  # the run itself succeeded: say why there is no report
        print(f"ipupod: no report written to {directory}: {exc}", flush=True)
