"""``ipu_tensorflow_addons.keras``: the IPU Keras layers and optimizers (reference §7)."""

from ipu_tensorflow.addons.keras import layers, optimizers

__all__ = ["layers", "optimizers"]
