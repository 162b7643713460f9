"""PopTorch's logger and ``setLogLevel`` (poptorch reference §1, PT python/_logging.py).

The level comes from ``POPTORCH_LOG_LEVEL`` at import (default ``WARN``, as PopTorch's code,
not its user guide's INFO) and from :func:`setLogLevel`.
"""

from __future__ import annotations

import logging
import os

__all__ = ["logger", "setLogLevel"]

logger = logging.getLogger("poptorch::python")

#: PopTorch's level names, and the legacy integers (0 TRACE .. 6 OFF)
_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERR": logging.ERROR, "OFF": logging.CRITICAL + 10}
_LEGACY = ("TRACE", "DEBUG", "INFO", "WARN", "ERR", "ERR", "OFF")


def setLogLevel(level: str | int) -> None:
    """Set how much PopTorch (here: ipupod's poptorch) prints: ``TRACE``, ``DEBUG``,
    ``INFO``, ``WARN``, ``ERR`` or ``OFF``, or a legacy integer 0-6.

    Raises:
        ValueError: another value ("Unknown log level: X. Valid values are DEBUG, ERR, INFO,
            OFF, TRACE and WARN").
    """
    if isinstance(level, int) and not isinstance(level, bool) and 0 <= level < len(_LEGACY):
        level = _LEGACY[level]
    if level not in _LEVELS:
        raise ValueError(f"Unknown log level: {level}. Valid values are DEBUG, ERR, INFO, OFF, "
                         "TRACE and WARN")
    logger.setLevel(_LEVELS[level])


def _init_from_env() -> None:
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "WARN"))


_init_from_env()
