"""Shared by the TF front end's tests: skip without TensorFlow, a configured system."""

from __future__ import annotations

import importlib.util
import re

import pytest

HAVE_TF = importlib.util.find_spec("tensorflow") is not None and \
    importlib.util.find_spec("tf_keras") is not None

#: every in-process TF test imports TensorFlow (about 5 s, 0.5 GB): slow, and skipped where
#: the extra 'tensorflow' is not installed
TF_MARKS = [pytest.mark.slow,
            pytest.mark.skipif(not HAVE_TF, reason="TensorFlow and tf-keras not installed "
                               "(pip install -e '.[tensorflow]'; pip install --no-deps "
                               "'tf-keras==2.21.*')")]


@pytest.fixture
def ipus():
    """``make(n)`` configures a system of n IPUs (n replicas); reset afterwards."""
    import ipu_node

    def make(n: int):
        from tensorflow.python import ipu
        cfg = ipu.config.IPUConfig()
        cfg.auto_select_ipus = n
        cfg.configure_ipu_system()
        return ipu

    yield make
    ipu_node.reset_ipu_configuration()


def layout_result(completed) -> tuple[str, str]:
    """The ``weights=`` and ``losses=`` a layout program printed (every instance alike)."""
    out = completed.stdout
    assert completed.returncode == 0, out + completed.stderr
    found = set(zip(re.findall(r"weights=([0-9a-f]+)", out), re.findall(r"losses=(\S+)", out)))
    assert len(found) == 1, out + completed.stderr
    return found.pop()
