"""The framework module names ipupod serves when the real package is not installed: TF-IPU's
``tensorflow.python.ipu``, Graphcore Keras' ``tensorflow.keras.ipu``,
``ipu_tensorflow_addons`` and Horovod's framework modules (``horovod.tensorflow``,
``horovod.torch``), each an alias of an ipupod module.

One table, :data:`SERVED`, names them all. :func:`install` (run at start-up by the
``ipupod_aliases.pth`` file that ipupod's wheel and editable install put in site-packages)
puts one finder first on ``sys.meta_path``. For a served name it asks the other finders
first, so a real TF-IPU, Graphcore Keras or Horovod installed beside ipupod wins; only when
they all decline does it serve ipupod's module under the served name (the same module object,
so ``tensorflow.python.ipu.config is ipu_tensorflow.ipu.config``). Names below a served
module follow it (``tensorflow.python.ipu.loops`` is ``ipu_tensorflow.ipu.loops``).

When ``tensorflow`` is first looked up, the finder sets ``TF_USE_LEGACY_KERAS=1`` unless the
program set it (to anything): TF-IPU programs are Keras 2 programs, and TensorFlow 2.21's
``tf.keras`` is tf-keras (Keras 2) only when the variable is set before ``import tensorflow``
(reference tf-keras-ipu.md §1.3).

This module imports nothing but the standard library (``importlib``, ``os``, ``sys``,
``types``): it runs in every Python process of the environment. PYTEST_DONT_REWRITE: pytest
would rewrite the modules of a distribution that has a ``pytest11`` plugin (ipupod's
``poprun.pytest_plugin``) and warn that this one was imported too early to rewrite; it has no
assertions.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

__all__ = ["SERVED", "install", "uninstall", "AliasFinder"]

#: served name -> the ipupod module that serves it (None: an empty namespace package, the
#: parent of served modules, itself served only when no real package of that name exists)
SERVED: dict[str, str | None] = {
    "tensorflow.python.ipu": "ipu_tensorflow.ipu",
    "tensorflow.keras.ipu": "ipu_tensorflow.keras",
    "ipu_tensorflow_addons": "ipu_tensorflow.addons",
    "horovod": None,
    "horovod.tensorflow": "ipu_tensorflow.horovod",
    "horovod.torch": "poptorch._horovod_torch",
}

_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"


class AliasFinder(importlib.abc.MetaPathFinder):
    """Serves the names of :data:`SERVED` after every other finder declined them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "tensorflow":
            os.environ.setdefault(_LEGACY_KERAS, "1")
            return None
        target_name, served = self._target(fullname)
        if served is None:
            return None
        if served == fullname:           # a served root: a real package wins
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        elif served not in _ROOTS:
            return None                  # below a real package: not ours
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(target_name),
            is_package=target_name is None or _is_package(target_name))

    @staticmethod
    def _target(fullname: str) -> tuple[str | None, str | None]:
        """(the ipupod module serving ``fullname``, the served root above it), or
        (None, None) when ``fullname`` is not served."""
        if fullname in SERVED:
            return SERVED[fullname], fullname
        head, _, tail = fullname.rpartition(".")
        parts = [tail]
        while head:
            if head in SERVED and SERVED[head] is not None:
                return f"{SERVED[head]}.{'.'.join(reversed(parts))}", head
            head, _, tail = head.rpartition(".")
            parts.append(tail)
        return None, None


class _Served(types.ModuleType):
    """An empty namespace package served by ipupod (the parent of served modules)."""


def _is_package(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None


class _AliasLoader(importlib.abc.Loader):
    """Loads a served name as its ipupod module (the same object); a served root is recorded
    so that names below it are served too."""

    def __init__(self, target: str | None):
        self.target = target

    def create_module(self, spec):
        if self.target is None:
            module = _Served(spec.name, "served by ipupod: no real package of this name")
            module.__path__ = []
            return module
        module = importlib.import_module(self.target)
        self._saved = module.__spec__
        if spec.name in SERVED:
            _ROOTS.add(spec.name)
        return module

    def exec_module(self, module):
        if self.target is not None:
            module.__spec__ = self._saved   # the module keeps its own spec and name


#: served roots that resolved to ipupod's modules in this process
_ROOTS: set[str] = set()

_finder = AliasFinder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Take the finder off ``sys.meta_path`` (modules already served stay imported)."""
    while _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
