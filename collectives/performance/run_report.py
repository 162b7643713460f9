"""Run reports: a JSON report, a Chrome/Perfetto trace and a text summary of a run.

Set ``IPUPOD_REPORT_DIR`` (or ``poprun --report-dir DIR``) and every instance of a run writes,
at interpreter exit, ``DIR/report-<instance>.json``, ``DIR/trace-<instance>.json`` and prints
a short summary (:func:`enable_at_exit`, installed by :func:`collectives._engine.runtime.get_engine`).
Poplar's way asks for the same: ``POPLAR_ENGINE_OPTIONS='{"autoReport.all": "true",
"autoReport.directory": "DIR"}'`` (or ``autoReport.outputExecutionProfile``), or those engine
options in ``IPUConfig.compilation_poplar_options`` (where ``utils.create_ipu_config(
profiling=True, report_directory=DIR)`` puts them); :func:`report_directory` says which wins.
:func:`write_report` does the same on demand. ``ipupod-report REPORT.json`` (:mod:`collectives.performance.report_cli`)
prints the summary and draws the step breakdown and a what_if scaling plot.

**The JSON report** (plain types; times in modelled seconds unless named ``wall_s``):

* ``system``, ``chip``, ``replicas``, ``ipus_per_replica``, ``instance``, ``instances``;
* ``options``: the ``IPUConfig`` options the program set (full dotted name: value; enums by
  name, secrets shown as ``"<set>"``), :meth:`ipu_node.config.IPUConfig.explicit_options`;
* ``collectives``: per op and schedule, ``calls``, ``payload_bytes`` (input bytes per
  replica, summed), ``method`` (the schedule the cost model charged, ``auto`` resolved),
  ``modelled_s``, ``wall_s``;
* ``ipus``: per IPU of this instance, ``compute_s``, ``copies_s``, ``collectives_s`` (from the
  modelled clock, :mod:`ipu_node.clock`, when the build has it; else the collectives only)
  and ``memory_peak_bytes`` (:func:`ipu_node.memory_usage`);
* ``timeline``: per IPU, the modelled clock's events (empty without the clock);
* ``step_estimate``: :func:`collectives.performance.step_model.predict` of the card given to
  :func:`use_model_card`, or None (a run declares no FLOPs without it);
* ``sections``: what front ends add with :func:`add_report_section` (e.g. ``poptorch``: its
  models, their options and the options the emulation does not act on).

**The trace** follows the Trace Event Format that chrome://tracing and ui.perfetto.dev read:
``M`` metadata events name the processes (``IPUs``, ``links``) and their threads (one per
IPU, tid = IPU id + 1, one per link class: IPU-Link, GW-Link, host network), and ``X`` complete events carry
``ts``/``dur`` in microseconds of modelled time. With the modelled clock
(:mod:`ipu_node.clock`) the IPU tracks are its events: ``compute``, ``sync`` (a BSP wait),
``exchange`` (copies, collectives), host I/O on the host network track, copies on the
IPU-Link (or GW-Link) track, overlapping transfers of several IPUs merged into one slice.
A collective is a BSP ``sync`` (one IPU-Link latency, an ipupod assumption: no source gives
the sync time) then an ``exchange`` on every IPU of the instance, and the same interval on
each link class it crosses. Without a clock the collectives are laid end to end in call
order. Slices of one track never overlap.
"""

from __future__ import annotations

import atexit
import enum
import json
import os
import threading
from typing import Any, Callable

from ipu_node.hardware.chips import chip_of_system
from ipu_node.hardware.links import IPU_LINK_LATENCY_S
from ipu_node.hardware.systems import get_system_model
from ipu_node.env import IPUPOD_REPORT_DIR as REPORT_DIR_ENV
from ipu_node.runtime.flags import report_directory as _report_directory

from collectives.records import CallRecord

__all__ = ["REPORT_DIR_ENV", "build_report", "build_report_of_ipus", "trace_events", "summary",
           "write_report", "write_payload", "enable_at_exit", "report_pending",
           "use_model_card", "report_directory", "options_set", "add_report_section",
           "IPU_PID", "LINK_PID", "LINK_CLASSES"]

#: Pid of the IPU tracks and of the link tracks in the trace.
IPU_PID, LINK_PID = 1, 2
#: Link classes, one track each (tid = index + 1).
LINK_CLASSES = ("IPU-Link", "GW-Link", "host network")

_state: dict[str, Any] = {"card": None, "config": None, "registered": False, "target": None}
_state_lock = threading.Lock()
_sections: dict[str, Callable[[], Any]] = {}


def add_report_section(name: str, provider: Callable[[], Any]) -> None:
    """Put ``provider()`` (plain JSON types) under ``sections[name]`` of every report built
    from now on; a front end (``poptorch``) describes its models there. Adding ``name``
    again replaces its provider. A provider that raises gives ``{"error": "<message>"}``."""
    _sections[name] = provider


def _section_values() -> dict:
    out = {}
    for name, provider in list(_sections.items()):
        try:
            out[name] = provider()
        except Exception as exc:  # the report is written at exit: never fail it
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def use_model_card(card, **config) -> None:
    """Put :func:`collectives.performance.step_model.predict` of ``card`` in this run's reports;
    ``config`` overrides the run's :class:`~collectives.performance.step_model.StepConfig` fields
    (``micro_batch``, ``gradient_accumulation``, ...)."""
    _state["card"], _state["config"] = card, dict(config)


def _clock():
    try:  # the modelled clock of ipu_node (branch exec-pipeline); absent in older builds
        from ipu_node import clock
    except ImportError:
        return None
    return clock


def _schedule(cost, record: CallRecord) -> str:
    if record.method != "auto" or cost is None or not hasattr(cost, "choose"):
        return record.method
    return cost.choose(record.op, record.nbytes, groups=record.groups, method="auto",
                       shape=record.shape)[1]


def build_report(system, ledger) -> dict:
    """The JSON report (module docstring) of ``system``'s run from ``ledger`` (its engine's
    :class:`~collectives._engine.ledger.Ledger`: ``collectives._engine.runtime.get_engine().ledger``)."""
    import ipu_node

    cost, records = ledger.cost_model, ledger.records()
    name = system.model.name if system.model is not None else None
    collectives: dict[tuple, dict] = {}
    for r in records:
        key = (r.op, _schedule(cost, r))
        row = collectives.setdefault(key, {"op": r.op, "method": key[1], "calls": 0,
                                           "payload_bytes": 0, "modelled_s": 0.0,
                                           "wall_s": 0.0})
        row["calls"] += 1
        row["payload_bytes"] += r.nbytes
        row["modelled_s"] += r.modelled_s or 0.0
        row["wall_s"] += r.wall_s
    ipus = [ipu.id for dev in system.devices for ipu in dev.ipus]
    clock = _clock()
    timelines = clock.timelines() if clock is not None else {}
    try:
        usage = ipu_node.memory_usage()
    except ipu_node.IPUError:  # the system was reset before the report
        usage = {}
    coll_total = sum(r.modelled_s or 0.0 for r in records if not r.op.startswith("host"))
    per_ipu = _per_ipu(ipus, timelines, {i: u.peak_bytes for i, u in usage.items()},
                       coll_total)
    report = {
        "system": name, "chip": chip_of_system(name).name if name else None,
        "replicas": system.num_replicas, "ipus_per_replica": system.ipus_per_replica,
        "instance": system.process_index, "instances": system.process_count,
        "options": options_set(system.config),
        "collectives": list(collectives.values()), "ipus": per_ipu,
        "timeline": _timeline(timelines),
        "calls": [{"op": r.op, "method": _schedule(cost, r), "nbytes": r.nbytes,
                   "groups": len(r.groups), "group_size": len(r.groups[0]) if r.groups else 0,
                   "crosses_domains": _crosses_domains(system, r),
                   "modelled_s": r.modelled_s or 0.0, "wall_s": r.wall_s} for r in records],
        "step_estimate": _estimate(system),
        "sections": _section_values(),
    }
    return report


def _per_ipu(ipus, timelines: dict, peaks: dict[int, int], collectives_s: float) -> dict:
    out = {}
    for i in ipus:
        tl = timelines.get(i)
        out[str(i)] = {
            "compute_s": tl.busy_s(("compute",)) if tl else 0.0,
            "copies_s": tl.busy_s(("copy",)) if tl else 0.0,
            "collectives_s": tl.busy_s(("collective",)) if tl else collectives_s,
            "memory_peak_bytes": peaks.get(i, 0),
        }
    return out


def _timeline(timelines: dict) -> dict:
    return {str(i): [e.to_dict() for e in tl.events()] for i, tl in timelines.items()}


def build_report_of_ipus(system: str | None, instance: int, instances: int, replicas: int,
                         ipus_per_replica: int, timelines: dict, peaks: dict[int, int]
                         ) -> dict:
    """The JSON report (module docstring) of a run with no configured IPU system and so no
    collectives: a front end's IPUs of their own (``poptorch``'s one-replica and inference
    models). ``system``: the modelled POD's name; ``replicas``: in the whole job;
    ``timelines``: IPU id -> :class:`ipu_node.clock.Timeline`; ``peaks``: IPU id -> peak
    bytes in use. ``options`` and ``collectives`` are empty; ``sections`` as
    :func:`build_report`."""
    return {
        "system": system, "chip": chip_of_system(system).name if system else None,
        "replicas": replicas, "ipus_per_replica": ipus_per_replica,
        "instance": instance, "instances": instances, "options": {}, "collectives": [],
        "ipus": _per_ipu(sorted(timelines), timelines, peaks, 0.0),
        "timeline": _timeline(timelines), "calls": [], "step_estimate": None,
        "sections": _section_values(),
    }


def options_set(config) -> dict[str, Any]:
    """The options ``config`` (an IPUConfig) had set, as plain JSON values."""
    def plain(path: str, value: Any) -> Any:
        if path.endswith("job_token"):
            return "<set>" if value else ""
        if isinstance(value, enum.Enum):
            return f"{type(value).__name__}.{value.name}"
        if isinstance(value, dict):
            return {str(k): plain("", v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain("", v) for v in value]
        return value if isinstance(value, (bool, int, float, str)) or value is None \
            else repr(value)
    explicit = getattr(config, "explicit_options", None)
    return {k: plain(k, v) for k, v in explicit().items()} if explicit else {}


def report_directory(system) -> str | None:
    """Where reports go (:func:`ipu_node.flags.report_directory`): ``IPUPOD_REPORT_DIR``,
    else ``POPLAR_ENGINE_OPTIONS``' autoReport, else the autoReport engine options in
    ``system.config.compilation_poplar_options``; None when none asks for them.

    Raises:
        ipu_node.IPUConfigError: POPLAR_ENGINE_OPTIONS is malformed (names it).
    """
    return _report_directory(getattr(system.config, "compilation_poplar_options", {}))


def _crosses_domains(system, record: CallRecord) -> bool:
    model = system.model
    if model is None or not record.groups:
        return False
    k = system.ipus_per_replica
    return any(len({model.domain_of(r * k) for r in g}) > 1 for g in record.groups)


def _estimate(system) -> dict | None:
    card = _state["card"]
    if card is None or system.model is None:
        return None
    from collectives.performance.step_model import StepConfig, predict
    fields = {"replicas": system.num_replicas, "ipus_per_replica": system.ipus_per_replica,
              "instances": system.process_count, **(_state["config"] or {})}
    est = predict(card, StepConfig(system.model.name, **fields))
    plain = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(card).items()}
    plain["compute_ops"] = [ops.to_plain() for ops in card.compute_ops]
    return {"step_s": est.step_s, "samples_per_s": est.samples_per_s,
            "breakdown": dict(est.breakdown), "allreduce_method": est.allreduce_method,
            "compute_breakdown": dict(est.compute_breakdown),
            "compute_categories": dict(est.compute_categories),
            "top_ops": [list(t) for t in est.top_ops],
            "card": plain, "config": fields, "table": est.table()}


def trace_events(report: dict) -> list[dict]:
    """The Trace Event Format events of ``report`` (module docstring)."""
    ipus = sorted(int(i) for i in report["ipus"])
    events: list[dict] = [
        {"ph": "M", "pid": IPU_PID, "tid": 0, "name": "process_name", "args": {"name": "IPUs"}},
        {"ph": "M", "pid": LINK_PID, "tid": 0, "name": "process_name",
         "args": {"name": "links"}},
    ]
    events += [{"ph": "M", "pid": IPU_PID, "tid": i + 1, "name": "thread_name",
                "args": {"name": f"IPU {i}"}} for i in ipus]
    events += [{"ph": "M", "pid": LINK_PID, "tid": t + 1, "name": "thread_name",
                "args": {"name": name}} for t, name in enumerate(LINK_CLASSES)]

    def slice_(pid, tid, name, cat, start_s, dur_s, args=None):
        events.append({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
                       "ts": start_s * 1e6, "dur": dur_s * 1e6, "args": args or {}})

    timeline = report.get("timeline") or {}
    if timeline:
        links: dict[str, list[tuple[float, float, str]]] = {c: [] for c in LINK_CLASSES}
        model = get_system_model(report["system"]) if report.get("system") else None
        for ipu, evs in timeline.items():
            track = []
            for e in evs:
                start, end = e["start_s"], e["start_s"] + e["duration_s"]
                if e["kind"] == "host_io":
                    links["host network"].append((start, end, e["label"]))
                    continue
                phase = {"compute": "compute", "sync": "sync"}.get(e["kind"], "exchange")
                if e["kind"] == "collective" and end > start:  # BSP: sync, then exchange
                    sync_end = min(end, start + IPU_LINK_LATENCY_S)
                    track.append((start, sync_end, "sync", "sync", "collective"))
                    start = sync_end
                track.append((start, end, e["label"], phase, e["kind"]))
                if e["kind"] == "copy" and e.get("peer") is not None and model is not None:
                    cross = model.domain_of(int(ipu)) != model.domain_of(int(e["peer"]))
                    links["GW-Link" if cross else "IPU-Link"].append((start, end, e["label"]))
                elif e["kind"] == "collective":
                    links["IPU-Link"].append((start, end, e["label"]))
            for start, end, label, phase, kind in _end_to_end(track):
                slice_(IPU_PID, int(ipu) + 1, label, phase, start, end - start, {"kind": kind})
        for t_id, name in enumerate(LINK_CLASSES):
            for start, end, label in _merged(links[name]):
                slice_(LINK_PID, t_id + 1, label, "exchange", start, end - start)
        return events
    t = 0.0
    for call in report["calls"]:
        total = call["modelled_s"]
        if total <= 0:
            continue
        host = call["op"].startswith("host")
        sync = 0.0 if host else min(IPU_LINK_LATENCY_S, total)
        for i in ipus:
            if sync:
                slice_(IPU_PID, i + 1, "sync", "sync", t, sync)
            slice_(IPU_PID, i + 1, call["op"], "exchange", t + sync, total - sync,
                   {"method": call["method"], "nbytes": call["nbytes"]})
        classes = (["host network"] if host else
                   ["IPU-Link"] + (["GW-Link"] if call["crosses_domains"] else []))
        for c in classes:
            slice_(LINK_PID, LINK_CLASSES.index(c) + 1, call["op"], "exchange", t + sync,
                   total - sync, {"method": call["method"]})
        t += total
    return events


def _end_to_end(track: list[tuple]) -> list[tuple]:
    """An IPU's events in start order, each starting no earlier than the previous ends (the
    clock keeps them apart; this guards a track against rounding)."""
    out, last = [], 0.0
    for start, end, *rest in sorted(track, key=lambda e: e[0]):
        start = max(start, last)
        end = max(end, start)
        out.append((start, end, *rest))
        last = end
    return out


def _merged(intervals: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Overlapping intervals of one link class (transfers of several IPUs at once) as one
    slice each: the first one's label and the union's extent."""
    out: list[list] = []
    for start, end, label in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end, label])
    return [tuple(x) for x in out]


def summary(report: dict) -> str:
    """A short text summary of ``report``."""
    lines = [f"ipupod report: {report['system']} ({report['chip']}), {report['replicas']} "
             f"replicas x {report['ipus_per_replica']} IPU, instance {report['instance']} of "
             f"{report['instances']}"]
    if report.get("options"):
        lines.append("  options set: " + ", ".join(f"{k}={v}"
                                                   for k, v in report["options"].items()))
    for row in report["collectives"]:
        lines.append(f"  {row['op']:<20} x{row['calls']:<5} {row['payload_bytes']:>12} B  "
                     f"modelled {row['modelled_s'] * 1e3:9.3f} ms  wall "
                     f"{row['wall_s'] * 1e3:9.3f} ms  {row['method'][:60]}")
    busy = max((v["compute_s"] + v["copies_s"] + v["collectives_s"]
                for v in report["ipus"].values()), default=0.0)
    lines.append(f"  busiest IPU: {busy * 1e3:.3f} modelled ms over {len(report['ipus'])} IPUs")
    est = report.get("step_estimate")
    if est:
        per_op = bool(est.get("compute_breakdown"))
        lines.append(f"  step estimate: {est['step_s'] * 1e3:.3f} ms, "
                     f"{est['samples_per_s']:,.0f} samples/s (collectives.performance.step_model of the "
                     "model card" + ("" if per_op else ": no BSP sync or on-chip exchange, which "
                                     "the modelled clock above counts") + ")")
        if per_op:
            lines.append("    compute by operation: " + ", ".join(
                f"{k} {v * 1e3:.3f} ms" for k, v in est["compute_breakdown"].items()))
            lines.append("    compute by unit: " + ", ".join(
                f"{k} {v * 1e3:.3f} ms" for k, v in est["compute_categories"].items()))
            lines.append("    top operations: " + "; ".join(
                f"{n} ({k}, x{c}) {t * 1e3:.3f} ms" for n, k, c, t in est["top_ops"][:5]))
    for name, section in (report.get("sections") or {}).items():
        text = section.get("summary") if isinstance(section, dict) else None
        if text:
            lines.append(f"  {name}:")
            lines.extend("    " + line for line in text.splitlines())
    lines += _stage_lines(report)
    return "\n".join(lines)


def _stage_lines(report: dict) -> list[str]:
    """Where each front-end model's stages spend their modelled compute (the sections'
    ``model`` entries with stages priced per operation)."""
    lines = []
    for name, entries in (report.get("sections") or {}).items():
        for entry in entries if isinstance(entries, list) else [entries]:
            model = entry.get("model") if isinstance(entry, dict) else None
            for stage in (model or {}).get("stages", []):
                if stage.get("compute"):
                    lines.append(f"  {name} '{model.get('name')}' stage {stage['stage']} "
                                 "compute of a micro-batch: " + ", ".join(
                                     f"{k} {v * 1e6:.1f} us" for k, v in stage["compute"]))
                    lines.append("    top operations: " + "; ".join(
                        f"{n} ({k}, x{c}) {t * 1e6:.1f} us"
                        for n, k, c, t in stage["top_ops"][:5]))
    return lines


def write_report(directory: str, system, ledger) -> tuple[str, str]:
    """Write ``report-<instance>.json`` and ``trace-<instance>.json`` into ``directory``
    (made if missing, mode 0700; files 0600). Returns the two paths. Arguments as
    :func:`build_report`."""
    return write_payload(directory, build_report(system, ledger))


def write_payload(directory: str, report: dict) -> tuple[str, str]:
    """Write ``report`` (:func:`build_report`, :func:`build_report_of_ipus`) as
    ``report-<instance>.json`` and its ``trace-<instance>.json`` into ``directory``, as
    :func:`write_report` does. Returns the two paths."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    paths = []
    for stem, payload in (("report", report),
                          ("trace", {"traceEvents": trace_events(report),
                                     "displayTimeUnit": "ms"})):
        path = os.path.join(directory, f"{stem}-{report['instance']}.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        paths.append(path)
    return paths[0], paths[1]


def report_pending() -> bool:
    """Whether this process writes a run report at exit (:func:`enable_at_exit` was asked
    for one): a front end then puts what it has in the report's ``sections`` rather than
    writing one of its own."""
    with _state_lock:
        return _state["target"] is not None


def enable_at_exit(system, ledger) -> None:
    """If a report is asked for (:func:`report_directory`), write the report of ``system``
    and ``ledger`` (its engine's) there at interpreter exit and print its summary (once per
    process: a later system, e.g. after a reconfiguration or widened replicas, replaces the
    earlier one in the report)."""
    directory = report_directory(system)
    if not directory:
        return
    with _state_lock:
        _state["target"] = (directory, system, ledger)
        if _state["registered"]:
            return
        _state["registered"] = True

    def _at_exit():
        directory, system, ledger = _state["target"]
        try:
            report_path, _ = write_report(directory, system, ledger)
            with open(report_path) as f:
                print(summary(json.load(f)) + f"\n  report: {report_path}", flush=True)
        except Exception as exc:  # the run itself succeeded: say why there is no report
            print(f"ipupod: no report written to {directory}: {exc}", flush=True)

    atexit.register(_at_exit)
