"""``ipu_tensorflow_addons`` (AD, reference tf-keras-ipu.md §7): the IPU Keras layers and
optimizers as the closest stock tf-keras ones. (Owned by the TF surface work.)"""

from ipu_tensorflow.addons import keras

__all__ = ["keras"]
