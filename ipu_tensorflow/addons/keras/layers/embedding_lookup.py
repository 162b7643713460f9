"""``Embedding`` (AD ``keras/layers/embedding_lookup.py``): an embedding lookup."""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from ipu_tensorflow.addons.keras.layers.ipu_layer import check_unsupported

__all__ = ["Embedding"]


class Embedding(tf_keras.layers.Embedding):
    """An embedding lookup: ``Embedding(input_dim, output_dim,
    embeddings_initializer='uniform', serialization_factor=1)``.

    Input ``[batch, input_length]`` int indices in ``[0, input_dim)``; output
    ``[batch, input_length, output_dim]`` of the layer's dtype; weight ``embeddings
    [input_dim, output_dim]``. A gather, numerically identical to tf-keras' ``Embedding``
    (reference §7). ``serialization_factor`` (the IPU splits the table into that many
    pieces to save memory) changes no number; it must divide ``input_dim``.

    Raises:
        NotImplementedError: ``embeddings_regularizer``, ``activity_regularizer``,
            ``embeddings_constraint``, ``mask_zero`` or ``input_length`` given (the add-on's
            message, reference §8 #18).
        ValueError: an input that is not 2-D ("The input shape should be a tensor of shape
            [batch, input_length], but is <shape>"); a ``serialization_factor`` that does
            not divide ``input_dim``.
    """

    def __init__(self, input_dim, output_dim, embeddings_initializer="uniform",
                 embeddings_regularizer=None, activity_regularizer=None,
                 embeddings_constraint=None, mask_zero=False, input_length=None,
                 serialization_factor=1, **kwargs):
        for value, name in ((embeddings_regularizer, "embeddings_regularizer"),
                            (activity_regularizer, "activity_regularizer"),
                            (embeddings_constraint, "embeddings_constraint"),
                            (mask_zero, "mask_zero"), (input_length, "input_length")):
            check_unsupported("Embedding", value, name)
        if serialization_factor < 1 or input_dim % serialization_factor:
            raise ValueError(f"Embedding: serialization_factor ({serialization_factor}) must "
                             f"be >= 1 and divide input_dim ({input_dim})")
        super().__init__(input_dim, output_dim, embeddings_initializer=embeddings_initializer,
                         **kwargs)
        self.serialization_factor = serialization_factor

    def call(self, inputs):
        if inputs.shape.rank != 2:
            raise ValueError("The input shape should be a tensor of shape "
                             f"[batch, input_length], but is {inputs.shape}")
        return super().call(inputs)

    def get_config(self):
        config = super().get_config()
        for key in ("embeddings_regularizer", "activity_regularizer",
                    "embeddings_constraint", "mask_zero", "input_length", "sparse"):
            config.pop(key, None)
        config["serialization_factor"] = self.serialization_factor
        return config
