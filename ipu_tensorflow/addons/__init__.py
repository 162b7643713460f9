"""``ipu_tensorflow_addons``: Graphcore's IPU add-ons for Keras on stock tf-keras.

Programs import ``ipu_tensorflow_addons.keras.layers`` and ``.optimizers`` (reference
tf-keras-ipu.md §7; the import hook of :mod:`ipu_tensorflow` serves this package under that
name when no real ``ipu_tensorflow_addons`` is installed). Each layer and optimizer is the
closest stock tf-keras 2.21 one, with the add-on's signature, defaults, refusals and error
messages; each docstring says where the numbers differ from the IPU's.
"""

from ipu_tensorflow.addons import keras

__all__ = ["keras"]
