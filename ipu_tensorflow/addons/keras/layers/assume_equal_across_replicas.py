"""``AssumeEqualAcrossReplicas`` (AD ``keras/layers/assume_equal_across_replicas.py``)."""

from __future__ import annotations

import tf_keras

__all__ = ["AssumeEqualAcrossReplicas"]


class AssumeEqualAcrossReplicas(tf_keras.layers.Layer):
    """Marks its inputs as equal on every replica (TF-IPU's
    ``cross_replica_ops.assume_equal_across_replicas``, reference §6.5): the identity.

    Input and output: a tensor or a nest of tensors, returned unchanged. The IPU uses the
    mark to skip divergent-control-flow checks; it has no numerical effect.
    """

    def __init__(self, inplace: bool = False, **kwargs):
        super().__init__(**kwargs)
        self._inplace = bool(inplace)

    def call(self, inputs, **kwargs):
        return inputs

    def get_config(self):
        return {**super().get_config(), "inplace": self._inplace}
