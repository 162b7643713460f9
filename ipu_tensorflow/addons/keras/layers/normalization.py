"""The IPU normalisation layers (AD ``keras/layers/normalization.py``): group, instance and
layer normalisation, with no moving statistics (training equals inference)."""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from ipu_tensorflow.addons.keras.layers.ipu_layer import check_unsupported

__all__ = ["GroupNormalization", "InstanceNormalization", "LayerNormalization", "GroupNorm",
           "InstanceNorm", "LayerNorm"]


class GroupNormalization(tf_keras.layers.Layer):
    """Group normalisation as the IPU computes it (https://arxiv.org/abs/1803.08494).

    ``GroupNormalization(groups=2, channels_axis=-1, center=True, scale=True, epsilon=1e-3,
    beta_initializer=None, gamma_initializer=None, strided_channel_grouping=True,
    trainable=True)``. Input ``[N, ..., C]`` (``channels_axis=-1``) or ``[N, C, ...]``
    (``channels_axis=1``), float; output the same shape and dtype. Per example and group,
    ``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the group's channels and all
    spatial positions; ``gamma`` and ``beta`` have shape ``[C]``.

    Differences from tf-keras' ``GroupNormalization`` (reference §7; this layer, not the stock
    one, is what the add-on computes): with ``strided_channel_grouping=True`` (the default)
    channel c belongs to group ``c mod groups``, where stock Keras groups contiguous blocks
    (``c // (C / groups)``; ``False`` gives that); the two agree only for one group or one
    channel per group. ``None`` initializers fall to Keras' default, ``glorot_uniform``, for
    gamma and beta alike (as on the IPU; pass ``'ones'``/``'zeros'`` for the usual start).
    Only channel axis 1 or -1. No moving statistics: training and inference compute alike.

    Raises:
        ValueError: at build: undefined rank, channel axis out of bounds or not 1/-1, more
            groups than channels, channels not a multiple of groups (the add-on's messages).
    """

    def __init__(self, groups=2, channels_axis=-1, center=True, scale=True, epsilon=1e-3,
                 beta_initializer=None, gamma_initializer=None, strided_channel_grouping=True,
                 trainable=True, **kwargs):
        super().__init__(trainable=trainable, **kwargs)
        self.groups = groups
        self.channels_axis = channels_axis
        self.center = center
        self.scale = scale
        self.epsilon = epsilon
        self.beta_initializer = tf_keras.initializers.get(beta_initializer)
        self.gamma_initializer = tf_keras.initializers.get(gamma_initializer)
        self.strided_channel_grouping = strided_channel_grouping
        self.channels = 1

    def build(self, input_shape):
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank is None:
            raise ValueError("Input has undefined rank.")
        rank = input_shape.rank
        if self.channels_axis > rank - 1:
            raise ValueError("Axis is out of bounds.")
        if self.channels_axis < 0:
            self.channels_axis = rank + self.channels_axis
        if self.channels_axis not in (1, rank - 1):
            raise ValueError("Unsupported data format, group norm only supports NCHW"
                             "(channel axis 1) and NHWC (channel axis -1).")
        self.channels = int(input_shape[self.channels_axis])
        if self.groups > self.channels:
            raise ValueError("Invalid groups %d for %d channels." % (self.groups, self.channels))
        if self.channels % self.groups != 0:
            raise ValueError("%d channels is not commensurate with %d groups."
                             % (self.channels, self.groups))
        if self.scale:
            self.gamma = self.add_weight("gamma", shape=[self.channels],
                                         initializer=self.gamma_initializer,
                                         trainable=self.trainable)
        if self.center:
            self.beta = self.add_weight("beta", shape=[self.channels],
                                        initializer=self.beta_initializer,
                                        trainable=self.trainable)
        super().build(input_shape)

    def _normalise_channels_last(self, x):
        """``x``: ``[N, ..., C]``; each group's statistics over the spatial axes and the
        group's channels."""
        rank = x.shape.rank
        per_group = self.channels // self.groups
        split = ([per_group, self.groups] if self.strided_channel_grouping
                 else [self.groups, per_group])
        shape = tf.shape(x)
        grouped = tf.reshape(x, tf.concat([shape[:-1], split], axis=0))
        # grouped: [N, ..., C/G, G] (strided) or [N, ..., G, C/G]; reduce all but N and G
        axes = list(range(1, rank - 1)) + [rank - 1 if self.strided_channel_grouping
                                           else rank]
        mean, var = tf.nn.moments(grouped, axes=axes, keepdims=True)
        normed = (grouped - mean) * tf.math.rsqrt(var + tf.cast(self.epsilon, x.dtype))
        out = tf.reshape(normed, shape)
        if self.scale:
            out = out * tf.cast(self.gamma, x.dtype)
        if self.center:
            out = out + tf.cast(self.beta, x.dtype)
        return out

    def call(self, inputs, training=None):
        rank = inputs.shape.rank
        if self.channels_axis == rank - 1:
            return self._normalise_channels_last(inputs)
        to_last = [0] + list(range(2, rank)) + [1]
        out = self._normalise_channels_last(tf.transpose(inputs, to_last))
        return tf.transpose(out, tf.math.invert_permutation(to_last))

    def get_config(self):
        return {"groups": self.groups, "channels_axis": self.channels_axis,
                "center": self.center, "scale": self.scale, "epsilon": self.epsilon,
                "beta_initializer": tf_keras.initializers.serialize(self.beta_initializer),
                "gamma_initializer": tf_keras.initializers.serialize(self.gamma_initializer),
                "strided_channel_grouping": self.strided_channel_grouping,
                "trainable": self.trainable}


class InstanceNormalization(GroupNormalization):
    """Instance normalisation (https://arxiv.org/abs/1607.08022): :class:`GroupNormalization`
    with one group per channel, set at build from the input's channel count C.

    ``InstanceNormalization(channels_axis=-1, center=True, scale=True, epsilon=1e-3,
    beta_initializer=None, gamma_initializer=None, trainable=True)``. With one channel per
    group, strided and contiguous grouping agree, so this equals tf-keras'
    ``GroupNormalization(groups=C)`` up to rounding (reference §7); ``None`` initializers
    are ``glorot_uniform`` as in :class:`GroupNormalization`.
    """

    def __init__(self, channels_axis=-1, center=True, scale=True, epsilon=1e-3,
                 beta_initializer=None, gamma_initializer=None, trainable=True, **kwargs):
        super().__init__(groups=0, channels_axis=channels_axis, center=center, scale=scale,
                         epsilon=epsilon, beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer, trainable=trainable, **kwargs)

    def build(self, input_shape):
        self.groups = int(tf.TensorShape(input_shape)[self.channels_axis])
        super().build(input_shape)

    def get_config(self):
        config = super().get_config()
        del config["groups"], config["strided_channel_grouping"]
        return config


class LayerNormalization(tf_keras.layers.LayerNormalization):
    """Layer normalisation (https://arxiv.org/abs/1607.06450) as tf-keras'
    ``LayerNormalization``.

    ``LayerNormalization(axis=-1, epsilon=1e-3, center=True, scale=True,
    beta_initializer='zeros', gamma_initializer='ones', beta_regularizer=None,
    gamma_regularizer=None, beta_constraint=None, gamma_constraint=None, trainable=True)``:
    the stock layer's defaults. Input any shape, float; statistics over ``axis`` per example.

    Differences (reference §7): the IPU computes it as group norm with one group over the
    flattened ``axis`` dimensions, equal up to rounding; its gamma and beta are then flat
    ``[prod(shape[axis])]`` where the stock layer keeps the axes' shape (the same for one
    axis). Regularizers and constraints are refused.

    Raises:
        NotImplementedError: a regularizer or constraint is given (the add-on's message).
    """

    def __init__(self, axis=-1, epsilon=1e-3, center=True, scale=True,
                 beta_initializer="zeros", gamma_initializer="ones", beta_regularizer=None,
                 gamma_regularizer=None, beta_constraint=None, gamma_constraint=None,
                 trainable=True, **kwargs):
        for value, name in ((beta_regularizer, "beta_regularizer"),
                            (gamma_regularizer, "gamma_regularizer"),
                            (beta_constraint, "beta_constraint"),
                            (gamma_constraint, "gamma_constraint")):
            check_unsupported("LayerNormalization", value, name)
        super().__init__(axis=axis, epsilon=epsilon, center=center, scale=scale,
                         beta_initializer=beta_initializer,
                         gamma_initializer=gamma_initializer, trainable=trainable, **kwargs)


GroupNorm = GroupNormalization
InstanceNorm = InstanceNormalization
LayerNorm = LayerNormalization
