"""``tensorflow.python.ipu.ipu_compiler``: ``compile(computation, inputs)`` on TF tensors
(TFI ``ipu/ipu_compiler.py:36-84``; reference tf-keras-ipu.md §6.4).

* In a replica function (traced by ``strategy.run``, or a replica's eager code) the
  computation is built in place and its outputs returned.
* Elsewhere ipu_node's :func:`ipu_node.ipu_compiler.compile` decides (the semantics once):
  under ``scopes.ipu_scope('/device:IPU:0')`` it runs as one unreplicated replica on the
  device's IPUs; under an ipu_node strategy's scope on every local replica, returning local
  replica 0's values; elsewhere TF-IPU's "... was not placed on an IPU device" error. A
  ``tf.function`` computation is traced once, without XLA, the replica's index an input
  (:mod:`ipu_tensorflow._bridge`).

Results: the computation's tensors as a list (one value: a 1-element list); no tensors:
a ``tf.Operation`` (a NoOp) in a ``tf.function``, None in eager code.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
from ipu_node import current_replica_context
from ipu_node import ipu_compiler as _np

from ipu_tensorflow import _bridge
from ipu_tensorflow.ipu.loops import _as_list, _is_operation

__all__ = ["compile"]


def _outputs(result: Any) -> list | None:
    if _is_operation(result):
        return None
    values = _as_list(result)
    count = next((i for i, o in enumerate(values) if _is_operation(o)), len(values))
    if not all(_is_operation(o) for o in values[count:]):
        raise ValueError("The computation must return zero or more Tensor values followed by "
                         "zero or more Operations.")
    return values[:count] or None


def compile(computation: Callable[..., Any], inputs: Any = None) -> Any:  # noqa: A001
    """Run ``computation(*inputs)`` on the IPU replicas (module docstring).

    Raises:
        NotPlacedOnIPUError: not under ``ipu_scope``, a strategy scope or a replica.
        NotConfiguredError: no IPU system is configured.
        ValueError: the computation returns operations before tensors.
    """
    args = [] if inputs is None else _as_list(inputs)
    if not tf.executing_eagerly() and (current_replica_context() is not None or
                                       _bridge.has_index_tensor()):
        outputs = _outputs(computation(*args))
        return outputs if outputs is not None else tf.no_op()
    replica_fn = _bridge.replica_function(computation)

    def per_replica(*arrays):
        index = tf.constant(current_replica_context().local_index, tf.int32)
        return _outputs(replica_fn(index, *arrays))

    return _np.compile(per_replica, args)
