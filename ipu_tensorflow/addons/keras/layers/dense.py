"""``SerialDense`` (AD ``keras/layers/dense.py``): a Dense layer whose matmul is split into
smaller ones."""

from __future__ import annotations

import tensorflow as tf
import tf_keras

__all__ = ["SerialDense"]

_DIMENSIONS = ("input_columns", "input_rows_kernel_columns", "kernel_rows")


class SerialDense(tf_keras.layers.Dense):
    """``activation(input @ kernel + bias)`` with the matmul computed in
    ``serialization_factor`` pieces (the add-on's memory trade on the IPU).

    ``SerialDense(units, serialization_factor, serialization_dimension, activation=None,
    use_bias=True, ...)`` (the stock Dense arguments otherwise). Input ``[..., m, k]``
    (``[batch, k]`` for 2-D), kernel ``[k, units]``, output ``[..., m, units]``. The pieces,
    with the add-on's names (AD ``dense.py`` docstring):

    * ``input_columns``: the ``m`` dimension of the input, pieces concatenated;
    * ``input_rows_kernel_columns``: the shared ``k`` dimension, partial products summed in
      piece order (the last bits may differ from one matmul, reference §7);
    * ``kernel_rows``: the ``n`` (``units``) dimension of the kernel, pieces concatenated.

    The weights are the stock Dense layer's (``kernel``, ``bias``), so checkpoints move
    between the two.

    Raises:
        ValueError: an unknown ``serialization_dimension`` or a factor below 1 (the
            add-on's messages); a factor that does not divide the serialised dimension.
    """

    def __init__(self, units, serialization_factor, serialization_dimension, **kwargs):
        super().__init__(units, **kwargs)
        self.serialization_factor = int(serialization_factor)
        self.serialization_dimension = serialization_dimension

    def _check(self, size: int, what: str) -> None:
        if self.serialization_factor < 1:
            raise ValueError("serialization_factor has to be at least 1, but was {}.".format(
                self.serialization_factor))
        if size is not None and size % self.serialization_factor:
            raise ValueError(f"SerialDense {self.name}: serialization_factor "
                             f"{self.serialization_factor} does not divide the {what} "
                             f"dimension ({size})")

    def _serial_matmul(self, inputs):
        f, dim = self.serialization_factor, self.serialization_dimension
        kernel = tf.cast(self.kernel, inputs.dtype)
        if dim == "input_columns":
            self._check(inputs.shape[-2], "m (input rows)")
            return tf.concat([tf.matmul(a, kernel) for a in tf.split(inputs, f, axis=-2)],
                             axis=-2)
        if dim == "input_rows_kernel_columns":
            self._check(inputs.shape[-1], "k (input columns)")
            parts = zip(tf.split(inputs, f, axis=-1), tf.split(kernel, f, axis=0))
            out = None
            for a, b in parts:
                out = tf.matmul(a, b) if out is None else out + tf.matmul(a, b)
            return out
        if dim == "kernel_rows":
            self._check(self.units, "n (units)")
            return tf.concat([tf.matmul(inputs, b) for b in tf.split(kernel, f, axis=1)],
                             axis=-1)
        raise ValueError("Invalid serialization_dimension={}, expected one of: "
                         "'input_columns', 'input_rows_kernel_columns', "
                         "'kernel_rows'.".format(dim))

    def call(self, inputs):
        inputs = tf.cast(inputs, self.compute_dtype)
        outputs = self._serial_matmul(inputs)
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, tf.cast(self.bias, outputs.dtype))
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def get_config(self):
        return {**super().get_config(), "serialization_factor": self.serialization_factor,
                "serialization_dimension": self.serialization_dimension}
