"""poprun: the ``poprun`` launcher, the PopDist API (``from poprun import popdist``),
``TFConfigClusterResolver``, and the pytest plugin that runs a test as a job
(:mod:`poprun.pytest_plugin`, :func:`poprun.testing.run_job`).

The names load on first use (PEP 562): the pytest plugin imports this package in every
pytest run of an environment where ipupod is installed, so importing it costs nothing
(``popdist`` brings the IPU runtime and numpy).
"""

from __future__ import annotations

import importlib

__all__ = ["popdist", "TFConfigClusterResolver"]

_LAZY = {"popdist": ("poprun.popdist", None),
         "TFConfigClusterResolver": ("poprun.cluster_resolver", "TFConfigClusterResolver")}


def __getattr__(name: str):
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'poprun' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
