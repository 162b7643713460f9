"""What TensorFlow needs so that ipupod's replicas cannot deadlock it (reference
tf-keras-ipu.md §2, "What the TF side adds"), and ``tf.keras.ipu``.

* **Inter-op threads.** A TF op that calls an ipupod collective (a ``numpy_function``,
  :mod:`ipu_tensorflow._bridge`) blocks one of TensorFlow's inter-op threads until every
  replica of the job arrives; with fewer inter-op threads than local replicas the replicas
  deadlock (RN E8). TF sizes that pool once, when its eager context starts, and refuses a
  change after ("Inter op parallelism cannot be modified after initialization.", TF
  ``eager/context.py:2250``). So :func:`reserve_inter_op_threads` runs when
  ``tensorflow.python.ipu`` is imported (before a program's first TF op, in every TF-IPU
  program) and sets the pool to :data:`MIN_INTER_OP_THREADS` or more, unless the program set
  ``TF_NUM_INTEROP_THREADS`` or the threads itself; :func:`check_inter_op_threads` runs in
  every ``configure_ipu_system`` and raises :class:`TFThreadsError` when TF already started
  with too few threads for the configured local replicas.
* **No XLA around a collective.** :func:`without_xla` re-wraps a ``jit_compile=True``
  function (Graphcore's advice) without XLA: XLA on the CPU refuses the ``PyFunc`` of a
  collective ("Detected unsupported operations", RN E11).
"""

from __future__ import annotations

import os

import tensorflow as tf
from ipu_node.runtime.system import add_configure_hook

__all__ = ["MIN_INTER_OP_THREADS", "TFThreadsError", "reserve_inter_op_threads",
           "check_inter_op_threads", "inter_op_threads", "without_xla", "attach_keras_ipu",
           "local_replicas_of"]

#: inter-op threads reserved at import (ipupod assumption: 16 local replicas, a POD16 in one
#: instance, plus one thread for the ops that feed them; idle threads cost no CPU)
MIN_INTER_OP_THREADS = 17


class TFThreadsError(RuntimeError):
    """TensorFlow started with fewer inter-op threads than the local replicas need."""


def _context_started() -> bool:
    from tensorflow.python.eager import context
    return context.context()._context_handle is not None


def inter_op_threads() -> int:
    """TF's inter-op thread count (0: TF's default, the machine's cores)."""
    return tf.config.threading.get_inter_op_parallelism_threads() or (os.cpu_count() or 1)


def reserve_inter_op_threads(count: int = MIN_INTER_OP_THREADS) -> None:
    """Make TF's inter-op pool at least ``count`` threads, if TF has not started yet and
    neither the program nor ``TF_NUM_INTEROP_THREADS`` chose a size."""
    if _context_started() or os.environ.get("TF_NUM_INTEROP_THREADS"):
        return
    if tf.config.threading.get_inter_op_parallelism_threads() in (0, None) or \
            tf.config.threading.get_inter_op_parallelism_threads() < count:
        tf.config.threading.set_inter_op_parallelism_threads(max(count, os.cpu_count() or 1))


def local_replicas_of(config) -> int:
    """The local replicas an ``IPUConfig`` asks for (its IPUs over ``ipus_per_replica``)."""
    counts = config.device_ipu_counts()
    ipus = counts[0] if counts else 1
    return max(1, ipus // max(1, config.ipus_per_replica))


def check_inter_op_threads(replicas: int) -> None:
    """Make sure ``replicas`` replicas can each block one inter-op thread in a collective.

    Raises:
        TFThreadsError: TF already started with fewer than ``replicas + 1`` inter-op threads;
            names the count, the replicas and the two ways out.
    """
    need = replicas + 1
    if not _context_started():
        reserve_inter_op_threads(need)
        return
    have = inter_op_threads()
    if have < need:
        raise TFThreadsError(
            f"TensorFlow started with {have} inter-op threads, but {replicas} local replicas "
            f"need at least {need} (each replica's collectives block one thread): import "
            "tensorflow.python.ipu before running any TensorFlow operation, or set "
            f"TF_NUM_INTEROP_THREADS={need} (or tf.config.threading."
            f"set_inter_op_parallelism_threads({need})) before TensorFlow starts")


def _on_configure(config) -> None:
    check_inter_op_threads(local_replicas_of(config))


def without_xla(fn):
    """``fn`` (a ``tf.function``) without ``jit_compile``: the same Python function traced
    without XLA (a collective inside cannot be XLA-compiled on the CPU); any other callable
    is returned unchanged."""
    python_fn = getattr(fn, "python_function", None)
    if python_fn is None or not getattr(fn, "_jit_compile", False):
        return fn
    return tf.function(python_fn, reduce_retracing=True)


def attach_keras_ipu() -> None:
    """Make ``tensorflow.keras.ipu`` an attribute of ``tf.keras`` (``keras.ipu.X`` after
    ``from tensorflow import keras``), when ``tf.keras`` is tf-keras."""
    import sys
    try:
        import tensorflow.keras.ipu as keras_ipu  # noqa: F401  (served by ipupod_aliases)
    except ImportError:
        return
    # ``from tensorflow import keras`` gives TF's lazy loader of tf-keras' API module:
    # the attribute goes on that module too
    for name in ("tensorflow.keras", "tf_keras.api._v2.keras"):
        keras = sys.modules.get(name)
        if keras is not None and not hasattr(keras, "ipu"):
            keras.ipu = keras_ipu


reserve_inter_op_threads()
add_configure_hook(_on_configure)
