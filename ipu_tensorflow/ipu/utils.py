"""``tensorflow.python.ipu.utils`` for TF programs (TFI ``ipu/utils.py``; seed 004:484-1272).

Every name is :mod:`ipu_node.utils`' own object (``IPUConfig``, ``SelectionOrder``,
``configure_ipu_system``, the deprecated ``create_ipu_config`` / ``auto_select_ipus`` /
``set_*_options`` API, ...), so ``ipu.utils``, ``ipu.config`` and ``popdist.tensorflow``
share one set of classes (reference tf-keras-ipu.md §2). What the TF side adds is here:
:func:`reset_ipu_seed` also seeds TensorFlow's random ops.
"""

from __future__ import annotations

import tensorflow as tf
from ipu_node import utils as _node_utils
from ipu_node.config import IPUConfig
from ipu_node.utils import *  # noqa: F401,F403

__all__ = list(_node_utils.__all__) + ["IPUConfig"]  # TFI ``utils.py:50-55`` re-exports it


def reset_ipu_seed(seed: int, device: str = "/device:IPU:0", cpu_device: str = "cpu",
                   experimental_identical_replicas: bool = False) -> None:
    """Reset the seeds of the replicas' random numbers (TFI ``ipu/utils.py:91-121``;
    seed 004:714-729).

    Two streams are reset: ipupod's per-replica streams
    (:func:`ipu_node.utils.reset_ipu_seed`: replica r draws from ``[seed, r]``, or every
    replica from ``[seed]`` with ``experimental_identical_replicas``), and TensorFlow's
    global seed (``tf.random.set_seed(seed)``), from which the op seeds of TF's stateful
    random ops and Keras' initializers and dropout follow. ipupod assumption: the replicas
    of one strategy share one traced function, so TF's own random ops draw the same numbers
    on every replica (as with ``experimental_identical_replicas``); per-replica numbers
    come from ipupod's streams.

    Raises:
        ValueError: ``device`` is not ``/device:IPU:0``.
        TypeError, ValueError: ``seed`` is not an int >= 0.
    """
    _node_utils.reset_ipu_seed(seed, device, cpu_device, experimental_identical_replicas)
    tf.random.set_seed(seed)
