"""``ipu_tensorflow_addons.keras.layers`` (AD ``layers/``). (Owned by the TF surface work;
empty so far.)"""

__all__: list[str] = []
