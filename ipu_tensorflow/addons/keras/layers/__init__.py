"""``ipu_tensorflow_addons.keras.layers``: the IPU Keras layers as the closest stock tf-keras
layers (reference tf-keras-ipu.md §7; AD ``keras/layers/__init__.py``).

========================= ============================================================
add-on layer              what it is here
========================= ============================================================
Dropout                   ``tf_keras.layers.Dropout``; seed pair, rate check
LayerNormalization        ``tf_keras.layers.LayerNormalization``; epsilon 1e-3
GroupNormalization        group norm with the IPU's strided channel grouping
InstanceNormalization     group norm with one group per channel
Embedding                 ``tf_keras.layers.Embedding``; 2-D input only
LSTM / PopnnLSTM          ``tf_keras.layers.LSTM``; IPU restrictions, ``biases``
GRU / PopnnGRU            ``tf_keras.layers.GRU(reset_after=True)``; IPU restrictions
SerialDense               ``tf_keras.layers.Dense`` computed in chunks
RecomputationCheckpoint   identity
AssumeEqualAcrossReplicas identity
========================= ============================================================
"""

from ipu_tensorflow.addons.keras.layers.assume_equal_across_replicas import \
    AssumeEqualAcrossReplicas
from ipu_tensorflow.addons.keras.layers.dense import SerialDense
from ipu_tensorflow.addons.keras.layers.dropout import Dropout
from ipu_tensorflow.addons.keras.layers.embedding_lookup import Embedding
from ipu_tensorflow.addons.keras.layers.normalization import (GroupNorm, GroupNormalization,
                                                              InstanceNorm,
                                                              InstanceNormalization, LayerNorm,
                                                              LayerNormalization)
from ipu_tensorflow.addons.keras.layers.recomputation import RecomputationCheckpoint
from ipu_tensorflow.addons.keras.layers.rnn import GRU, LSTM, PopnnGRU, PopnnLSTM

__all__ = ["AssumeEqualAcrossReplicas", "SerialDense", "Dropout", "Embedding",
           "GroupNormalization", "InstanceNormalization", "LayerNormalization", "GroupNorm",
           "InstanceNorm", "LayerNorm", "RecomputationCheckpoint", "LSTM", "PopnnLSTM", "GRU",
           "PopnnGRU"]
