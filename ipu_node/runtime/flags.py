"""Graphcore's environment flags, as the emulated layers read them.

* ``TF_POPLAR_FLAGS`` (:func:`poplar_flags`): TF-IPU's flags, ``--name`` or ``--name=value``
  separated by spaces (seed 002:111-115: append, never overwrite). Every flag of TF-IPU's
  list is known; an unknown one is an error naming it ("Unknown flag in TF_POPLAR_FLAGS:
  --x", TF-IPU stops there too). What each does in ipupod is in :data:`FLAG_EFFECTS`.
* ``POPLAR_ENGINE_OPTIONS`` (:func:`engine_options`): a JSON object of Poplar engine options
  (seed 000:255, 001:877-882); malformed JSON is an error naming the variable.
  ``autoReport.all`` or ``autoReport.outputExecutionProfile`` set to ``"true"`` make every
  instance write its run report and Perfetto trace into ``autoReport.directory`` (default
  ``.``) at exit, as ``poprun --report-dir`` does (:func:`auto_report_directory`).
* ``POPLAR_LOG_LEVEL``, ``POPLAR_LOG_DEST``, ``POPLIBS_LOG_LEVEL`` (:func:`configure_logging`,
  applied when an IPU system is configured): Poplar's levels ``OFF`` (the default: ipupod's
  loggers are left as the program set them), ``ERR``, ``WARN``, ``INFO``, ``DEBUG``,
  ``TRACE`` (seed 001:855-864) for the ``ipu_node`` loggers (the emulated Poplar runtime:
  attach, memory, pipelines) and the ``collectives`` loggers (the GCL/PopLibs layer);
  ``POPLAR_LOG_DEST`` is ``stdout``, ``stderr`` (default) or a file name (appended to,
  created 0600). Lines look like Poplar's: ``hh:mm:ss.mmm pid POPLAR [I] message``.

Values are read when these functions are called (never at import), so a program may set
the variables before configuring its IPUs.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from ipu_node import env
from ipu_node.errors import IPUConfigError

__all__ = ["PoplarFlags", "FLAG_EFFECTS", "poplar_flags", "engine_options",
           "auto_report_directory", "report_directory", "configure_logging", "LOG_LEVELS"]

#: TF-IPU's flags (its poplar_xla_flags list) and what they do in ipupod.
FLAG_EFFECTS: dict[str, str] = {
    "use_ipu_model": "acts: the IPUs are IPU Model devices (no partition locks, "
                     "utils.running_on_ipu_model() is True, --ipu_model_tiles applies; "
                     "multi-replica distribution is refused, as TF-IPU refuses it)",
    "ipu_model_tiles": "acts under --use_ipu_model: tiles per IPU unless "
                       "ipu_model.tiles_per_ipu is set",
    "executable_cache_path": "acts: the directory is created (0700) when the system is "
                             "configured; nothing is cached (ipupod compiles nothing)",
    "show_progress_bar": "checked (true, false or auto); no effect: there is no compilation "
                         "to show",
    "max_compilation_threads": "checked (an int); no effect: nothing is compiled",
    "max_infeed_threads": "checked (an int); no effect: feeds read their dataset in the "
                          "replica's thread",
    "use_synthetic_data": "accepted, no effect: feeds always carry the dataset's data",
    "synthetic_data_categories": "accepted, no effect (see use_synthetic_data)",
    "synthetic_data_initializer": "accepted, no effect (see use_synthetic_data)",
    "help": "prints the flags and what they do in ipupod",
}
_NO_EFFECT = ("log_cycle_count", "while_loop_brute_force_max_trip_count", "save_vertex_graph",
              "save_interval_report", "dump_schedule_as_dot", "tensor_map_file_path",
              "fallback_scheduler", "allow_nans", "null_data_feed",
              "on_demand_device_poll_time", "on_demand_device_timeout", "sync_replica_start",
              "enable_hlo_verifier", "disable_poplar_version_check",
              # deprecated in TF-IPU, still accepted there
              "dump_text_reports_to_stdio", "add_all_reduce_copies", "force_replicated_mode",
              "save_oom_profiler")
for _name in _NO_EFFECT:
    FLAG_EFFECTS[_name] = "accepted, no effect: it steers Poplar's compiler or hardware"
_INT_FLAGS = ("max_compilation_threads", "max_infeed_threads", "ipu_model_tiles",
              "log_cycle_count", "while_loop_brute_force_max_trip_count",
              "on_demand_device_poll_time", "on_demand_device_timeout")
_BOOL_FLAGS = ("use_ipu_model", "use_synthetic_data", "help", "dump_schedule_as_dot",
               "fallback_scheduler", "allow_nans", "null_data_feed", "sync_replica_start",
               "enable_hlo_verifier", "disable_poplar_version_check",
               "dump_text_reports_to_stdio", "add_all_reduce_copies", "force_replicated_mode")


@dataclass(frozen=True)
class PoplarFlags:
    """``TF_POPLAR_FLAGS`` parsed. ``values`` holds every flag given (name: parsed value)."""

    use_ipu_model: bool = False
    ipu_model_tiles: int = -1
    executable_cache_path: str = ""
    show_progress_bar: str = "auto"
    max_compilation_threads: int = -1
    max_infeed_threads: int = -1
    values: dict[str, Any] = field(default_factory=dict)


def _parse_value(name: str, text: str | None) -> Any:
    where = f"TF_POPLAR_FLAGS: --{name}"
    if name in _BOOL_FLAGS:
        if text is None or text.lower() in ("true", "1"):
            return True
        if text.lower() in ("false", "0"):
            return False
        raise IPUConfigError(f"{where}={text!r} is not a bool (true or false)")
    if text is None:
        raise IPUConfigError(f"{where} needs a value (--{name}=...)")
    if name in _INT_FLAGS:
        try:
            return int(text)
        except ValueError:
            raise IPUConfigError(f"{where}={text!r} is not an int") from None
    if name == "show_progress_bar" and text not in ("true", "false", "auto"):
        raise IPUConfigError(f"{where}={text!r} must be true, false or auto")
    return text


def poplar_flags() -> PoplarFlags:
    """``TF_POPLAR_FLAGS`` parsed (module docstring).

    Raises:
        IPUConfigError: an unknown flag (named, as TF-IPU's "Unknown flag in
            TF_POPLAR_FLAGS"), a word that is no ``--flag``, or a bad value (named).
    """
    raw = env.raw(env.TF_POPLAR_FLAGS)
    try:
        words = shlex.split(raw)
    except ValueError as exc:
        raise IPUConfigError(f"TF_POPLAR_FLAGS={raw!r} cannot be split into flags: "
                             f"{exc}") from None
    values: dict[str, Any] = {}
    unknown = []
    for word in words:
        if not word.startswith("--"):
            raise IPUConfigError(f"TF_POPLAR_FLAGS: {word!r} is not a flag (--name or "
                                 "--name=value)")
        name, eq, text = word[2:].partition("=")
        if name not in FLAG_EFFECTS:
            unknown.append(word)
            continue
        values[name] = _parse_value(name, text if eq else None)
    if unknown:
        raise IPUConfigError(f"Unknown flag{'s' if len(unknown) > 1 else ''} in "
                             f"TF_POPLAR_FLAGS: {' '.join(unknown)} (known: "
                             f"{', '.join('--' + n for n in sorted(FLAG_EFFECTS))})")
    if values.get("help"):
        print("Usage for TF_POPLAR_FLAGS in ipupod:\n" + "\n".join(
            f"\t--{n}: {e}" for n, e in sorted(FLAG_EFFECTS.items())), file=sys.stderr)
    known = {k: values[k] for k in PoplarFlags.__dataclass_fields__ if k in values}
    return PoplarFlags(**known, values=values)


def engine_options() -> dict[str, str]:
    """``POPLAR_ENGINE_OPTIONS`` as a dict ({} when unset).

    Raises:
        IPUConfigError: not JSON, not an object, or an ``autoReport.*`` switch that is not
            ``"true"``/``"false"`` (names the variable).
    """
    raw = env.raw(env.POPLAR_ENGINE_OPTIONS).strip()
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise IPUConfigError(f"POPLAR_ENGINE_OPTIONS is not valid JSON ({exc}): "
                             f"{raw[:200]!r}") from None
    if not isinstance(options, dict):
        raise IPUConfigError(f"POPLAR_ENGINE_OPTIONS must be a JSON object such as "
                             f"'{{\"autoReport.all\": \"true\"}}', got {raw[:200]!r}")
    out = {}
    for key, value in options.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key.startswith("autoReport.") and key != "autoReport.directory" and \
                text not in ("true", "false"):
            raise IPUConfigError(f"POPLAR_ENGINE_OPTIONS: {key} must be \"true\" or "
                                 f"\"false\", got {value!r}")
        out[key] = text
    return out


def auto_report_directory() -> str | None:
    """Where ``POPLAR_ENGINE_OPTIONS`` asks for reports: ``autoReport.directory`` (default
    ``.``) when ``autoReport.all`` or ``autoReport.outputExecutionProfile`` is true; else
    None.

    Raises:
        IPUConfigError: see :func:`engine_options`.
    """
    options = engine_options()
    if "true" in (options.get("autoReport.all"), options.get("autoReport.outputExecutionProfile")):
        return options.get("autoReport.directory") or "."
    return None


def report_directory(*engine_options_sets: dict) -> str | None:
    """Where the run reports go (the collectives' and PopTorch's): ``IPUPOD_REPORT_DIR``
    (``poprun --report-dir``), else ``POPLAR_ENGINE_OPTIONS``' autoReport
    (:func:`auto_report_directory`), else the autoReport of the first of
    ``engine_options_sets`` that asks for one (a program's own Poplar engine options:
    ``IPUConfig.compilation_poplar_options``, a PopTorch model's ``engineOptions``; values
    compared as lower-case text); None when none asks for reports.

    Raises:
        IPUConfigError: see :func:`engine_options`.
    """
    directory = env.report_dir() or auto_report_directory()
    if directory:
        return directory
    for options in engine_options_sets:
        options = options or {}
        if "true" in (str(options.get("autoReport.all")).lower(),
                      str(options.get("autoReport.outputExecutionProfile")).lower()):
            return options.get("autoReport.directory") or "."
    return None


#: Poplar's log levels (seed 001:855-864) as Python logging levels (TRACE is below DEBUG).
LOG_LEVELS = {"OFF": None, "ERR": logging.ERROR, "WARN": logging.WARNING,
              "INFO": logging.INFO, "DEBUG": logging.DEBUG, "TRACE": 5}
_LETTER = {logging.ERROR: "E", logging.WARNING: "W", logging.INFO: "I", logging.DEBUG: "D",
           5: "T", logging.CRITICAL: "E"}


class _PoplarFormatter(logging.Formatter):
    def __init__(self, component: str):
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        clock = self.formatTime(record, "%H:%M:%S") + f".{int(record.msecs):03d}"
        letter = _LETTER.get(record.levelno, "I")
        return f"{clock} {record.process} {self.component} [{letter}] {record.getMessage()}"


_installed: dict[str, logging.Handler] = {}


def _level(name: str) -> int | None:
    text = env.raw(name).strip().upper()
    if not text:
        return None
    if text not in LOG_LEVELS:
        raise IPUConfigError(f"{name}={text!r} is not a Poplar log level: "
                             f"{', '.join(LOG_LEVELS)}")
    return LOG_LEVELS[text] if LOG_LEVELS[text] is not None else logging.CRITICAL + 10


def _handler(component: str) -> logging.Handler:
    dest = env.raw(env.POPLAR_LOG_DEST).strip() or "stderr"
    if dest in ("stdout", "stderr"):
        handler: logging.Handler = logging.StreamHandler(getattr(sys, dest))
    else:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        handler = logging.StreamHandler(os.fdopen(fd, "a", buffering=1))
    handler.setFormatter(_PoplarFormatter(component))
    return handler


def configure_logging() -> None:
    """Apply ``POPLAR_LOG_LEVEL``/``POPLIBS_LOG_LEVEL``/``POPLAR_LOG_DEST`` (module
    docstring). Unset levels leave the loggers alone; calling again replaces what an earlier
    call installed.

    Raises:
        IPUConfigError: a level that is not one of :data:`LOG_LEVELS` (names the variable).
        OSError: ``POPLAR_LOG_DEST`` names a file that cannot be opened (or a symlink).
    """
    for variable, logger_name, component in ((env.POPLAR_LOG_LEVEL, "ipu_node", "POPLAR"),
                                             (env.POPLIBS_LOG_LEVEL, "collectives",
                                              "POPLIBS")):
        level = _level(variable)
        logger = logging.getLogger(logger_name)
        old = _installed.pop(logger_name, None)
        if old is not None:
            logger.removeHandler(old)
            logger.propagate = True
            if isinstance(old, logging.StreamHandler) and \
                    old.stream not in (sys.stdout, sys.stderr):
                old.stream.close()
        if level is None:
            continue
        logger.setLevel(level)
        if level <= logging.CRITICAL:  # (OFF: the level silences them, no handler)
            handler = _handler(component)
            logger.addHandler(handler)
            logger.propagate = False  # Poplar's destination only, not twice
            _installed[logger_name] = handler
