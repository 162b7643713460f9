"""``ipu_tensorflow_addons.keras.optimizers`` (AD ``optimizers/``). (Owned by the TF surface
work; empty so far.)"""

__all__: list[str] = []
