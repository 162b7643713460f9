"""The IPU recurrent layers (AD ``keras/layers/rnn.py``): ``PopnnLSTM`` / ``LSTM`` and
``PopnnGRU`` / ``GRU`` as tf-keras' LSTM and GRU, with the IPU layers' restrictions."""

from __future__ import annotations

import tensorflow as tf
import tf_keras

__all__ = ["PopnnLSTM", "LSTM", "PopnnGRU", "GRU"]


def _refuse(kind: str, args: dict) -> None:
    """The IPU layer's refusals, in its order and with its messages (AD ``rnn.py``)."""
    if not args["use_bias"]:
        raise ValueError(f"IPU custom {kind} layer does not support use_bias = False.")
    for name in ("kernel_regularizer", "recurrent_regularizer", "bias_regularizer",
                 "activity_regularizer", "kernel_constraint", "recurrent_constraint",
                 "bias_constraint"):
        if args[name]:
            raise ValueError(f"IPU custom {kind} layer does not support {name}.")
    if args["recurrent_dropout"] != 0.0:
        tail = "recurrent_dropout." if kind == "LSTM" else "recurrent_dropout != 0."
        raise ValueError(f"IPU custom {kind} layer does not support {tail}")
    if args["implementation"] != 1:
        raise ValueError(f"IPU custom {kind} layer does not support implementation != 1.")
    if args["go_backwards"]:
        raise ValueError(f"IPU custom {kind} layer does not support go_backwards = True.")
    if args["unroll"]:
        raise ValueError(f"IPU custom {kind} layer does not support unroll = True.")


def _stock_kwargs(args: dict) -> dict:
    """The arguments the stock layer takes (the IPU-only and refused ones removed)."""
    drop = {"self", "kwargs", "__class__", "dropout_seed", "partials_dtype", "seed",
            "implementation", "recurrent_dropout"}
    return {k: v for k, v in args.items() if k not in drop} | args["kwargs"]


class PopnnLSTM(tf_keras.layers.LSTM):
    """A long short-term memory layer (Hochreiter 1997) as the IPU's PopLibs LSTM.

    ``PopnnLSTM(units, activation='tanh', recurrent_activation='sigmoid', use_bias=True,
    kernel_initializer='glorot_uniform', recurrent_initializer='orthogonal',
    bias_initializer='zeros', unit_forget_bias=True, dropout=0., dropout_seed=None,
    return_sequences=False, return_state=False, stateful=False, time_major=False,
    partials_dtype=tf.float32, seed=None, ...)``. Input ``[batch, time, features]``
    (``[time, batch, features]`` with ``time_major``), float32; output ``[batch, units]``,
    or ``[batch, time, units]`` with ``return_sequences``, plus the final ``h`` and ``c``
    ``[batch, units]`` with ``return_state``.

    tf-keras' ``LSTM`` computes it (reference §7): the same gate order (i, f, c, o; PopLibs
    ``cellOrder``) and weight shapes (``kernel [features, 4u]``, ``recurrent_kernel
    [u, 4u]``, bias ``[4u]``), equal up to rounding. Differences: the bias weight is named
    ``bias`` (the IPU's ``biases``); input dropout uses one mask across time, as here, but
    from another random stream (``dropout_seed`` is accepted and unused);
    ``partials_dtype`` (the IPU's partial-sum precision) changes nothing here.

    Raises:
        ValueError: ``use_bias=False``, a regularizer or constraint, ``recurrent_dropout``,
            ``implementation != 1``, ``go_backwards`` or ``unroll`` ("IPU custom LSTM layer
            does not support ...", the IPU layer's messages).
    """

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal",
                 bias_initializer="zeros", unit_forget_bias=True, kernel_regularizer=None,
                 recurrent_regularizer=None, bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, recurrent_constraint=None, bias_constraint=None,
                 dropout=0., dropout_seed=None, recurrent_dropout=0., implementation=1,
                 return_sequences=False, return_state=False, go_backwards=False,
                 stateful=False, unroll=False, partials_dtype=tf.float32, seed=None,
                 time_major=False, **kwargs):
        args = dict(locals())
        _refuse("LSTM", args)
        super().__init__(**_stock_kwargs(args))
        self.partials_dtype = tf.as_dtype(partials_dtype)


class PopnnGRU(tf_keras.layers.GRU):
    """A gated recurrent unit (Cho et al. 2014) as the IPU's PopLibs GRU.

    ``PopnnGRU(units, activation='tanh', recurrent_activation='sigmoid', use_bias=True,
    ..., dropout=0., dropout_seed=None, return_sequences=False, return_state=False,
    stateful=False, reset_after=True, seed=None, partials_dtype=tf.float32,
    time_major=False)``. Shapes as :class:`PopnnLSTM` (one state ``h``).

    tf-keras' ``GRU`` computes it with the same gates (z, r, h) and weights (``kernel
    [features, 3u]``, ``recurrent_kernel [u, 3u]``, bias ``[2, 3u]`` when ``reset_after``),
    equal up to rounding (reference §7). ``reset_after`` defaults to True as on the IPU
    (stock Keras 2's GRU too). The same random-stream and ``partials_dtype`` notes as
    :class:`PopnnLSTM`.

    Raises:
        ValueError: the restrictions of :class:`PopnnLSTM` ("IPU custom GRU layer does not
            support ...").
    """

    def __init__(self, units, activation="tanh", recurrent_activation="sigmoid", use_bias=True,
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal",
                 bias_initializer="zeros", kernel_regularizer=None, recurrent_regularizer=None,
                 bias_regularizer=None, activity_regularizer=None, kernel_constraint=None,
                 recurrent_constraint=None, bias_constraint=None, dropout=0.,
                 dropout_seed=None, recurrent_dropout=0., implementation=1,
                 return_sequences=False, return_state=False, go_backwards=False,
                 stateful=False, unroll=False, reset_after=True, seed=None,
                 partials_dtype=tf.float32, time_major=False, **kwargs):
        args = dict(locals())
        _refuse("GRU", args)
        super().__init__(**_stock_kwargs(args))
        self.partials_dtype = tf.as_dtype(partials_dtype)


LSTM = PopnnLSTM
GRU = PopnnGRU
