"""``tensorflow.python.ipu.keras_extensions`` (TFI ``ipu/keras_extensions.py``): the
extended class of Keras models constructed in an IPU strategy's scope (:mod:`ipu_tensorflow._keras`)."""

from ipu_tensorflow._keras import extended_class, install

__all__ = ["extended_class", "install"]
