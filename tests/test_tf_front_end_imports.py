"""The TF front end's import names (issue 32, set-up): TF-IPU's module names resolve to
ipupod's modules through the installed ``ipupod_aliases.pth``, only when no real package of
that name is installed; ``tf.python`` stays absent; Keras is tf-keras.

Each test starts an interpreter that imports TensorFlow (about 5 s): marked slow."""

import importlib.util
import sys

import pytest

from tests.procs import PROGRAMS, ROOT, child_env, run

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="TensorFlow (the extra 'tensorflow') not installed")]


def test_a_tf_ipu_program_imports_its_names_from_ipupod():
    result = run([sys.executable, str(PROGRAMS / "tf_import_names.py")], 180,
                 env=child_env(), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ipu_tensorflow_addons, horovod.tensorflow" in result.stdout


def test_a_real_package_of_a_served_name_wins(tmp_path):
    """A real ``ipu_tensorflow_addons`` and a real ``horovod`` on the path are imported, not
    ipupod's (the finder answers after the other finders)."""
    for name in ("ipu_tensorflow_addons", "horovod/tensorflow"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "horovod" / "__init__.py").write_text("REAL = True\n")
    code = ("import ipu_tensorflow_addons, horovod.tensorflow as h, horovod;"
            "assert ipu_tensorflow_addons.REAL and h.REAL and horovod.REAL;"
            "import ipupod_aliases;"
            "assert not ipupod_aliases.AliasFinder._target('x.y')[0];"
            "print('real')")
    env = child_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    result = run([sys.executable, "-c", code], 60, env=env, cwd=tmp_path)
    assert result.returncode == 0 and "real" in result.stdout, result.stdout + result.stderr


def test_tf_use_legacy_keras_set_by_the_program_is_kept():
    code = ("import os; os.environ['TF_USE_LEGACY_KERAS'] = '0';"
            "import tensorflow as tf; print(tf.keras.Sequential.__module__)")
    result = run([sys.executable, "-c", code], 120, env=child_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert not result.stdout.strip().startswith("tf_keras"), result.stdout
