"""``RecomputationCheckpoint`` (AD ``keras/layers/recomputation.py``)."""

from __future__ import annotations

import tf_keras

__all__ = ["RecomputationCheckpoint"]


class RecomputationCheckpoint(tf_keras.layers.Layer):
    """Marks its inputs as a recomputation checkpoint of a pipelined model: the identity.

    Input and output: a tensor or a nest of tensors, returned unchanged. On the IPU the mark
    only changes which activations are stashed or recomputed when
    ``RecomputationMode.RecomputeAndBackpropagateInterleaved`` is used (reference §5.4);
    ipupod recomputes whole stages, so the mark changes neither numbers nor the model's
    structure.
    """

    def call(self, inputs, **kwargs):
        return inputs
