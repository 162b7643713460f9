"""``ipu_tensorflow_addons.keras``: ``layers`` and ``optimizers``."""

from ipu_tensorflow.addons.keras import layers, optimizers

__all__ = ["layers", "optimizers"]
