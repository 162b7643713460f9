"""The public import paths of the modules that live in a subpackage of ``collectives``.

``collectives.strategies``, ``distributed_variables``, ``optimizers`` and ``horovod`` (the
framework layer, :mod:`collectives.framework`), ``collectives.cost_model``, ``step_model``,
``run_report``, ``report_cli`` and ``schedules`` (the performance model,
:mod:`collectives.performance`; ``schedules`` is its ``pricing``) are the names the README,
TF-IPU and the programs written for them use. Importing one gives the module itself (the
same object as its path in the subpackage, so its state, its classes and a test's patches
are one), and ``collectives.horovod.X`` is ``collectives.framework.horovod.X``:
:func:`install` puts a finder for them on ``sys.meta_path`` when ``collectives`` is
imported. There are no files at those paths, so that a file's history follows it into its
subpackage.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["MOVED", "install"]

#: the public path -> where the module lives
MOVED = {
    "collectives.strategies": "collectives.framework.strategies",
    "collectives.distributed_variables": "collectives.framework.distributed_variables",
    "collectives.optimizers": "collectives.framework.optimizers",
    "collectives.horovod": "collectives.framework.horovod",
    "collectives.cost_model": "collectives.performance.cost_model",
    "collectives.step_model": "collectives.performance.step_model",
    "collectives.run_report": "collectives.performance.run_report",
    "collectives.report_cli": "collectives.performance.report_cli",
    "collectives.schedules": "collectives.performance.pricing",
}


def _target(name: str) -> str | None:
    """Where module ``name`` lives, when it is a public path of :data:`MOVED` (or a
    submodule of one)."""
    if not name.startswith("collectives."):
        return None
    found = MOVED.get(name)
    if found is not None:
        return found
    head, dot, tail = name.rpartition(".")
    while head:
        found = MOVED.get(head)
        if found is not None:
            return f"{found}{dot}{tail}"
        head, dot, more = head.rpartition(".")
        tail = f"{more}.{tail}"
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a public path of :data:`MOVED` and loads it as the module where it lives."""

    def find_spec(self, name, path=None, target=None):
        where = _target(name)
        if where is None:
            return None
        spec = importlib.util.spec_from_loader(name, self)
        spec.loader_state = where
        return spec

    def create_module(self, spec):
        return importlib.import_module(spec.loader_state)  # (kept as it is: its own name)

    def exec_module(self, module) -> None:
        pass  # (run already, under its own path)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the finder of files, which
    would find ``collectives.horovod``'s submodules a second time under that name."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
