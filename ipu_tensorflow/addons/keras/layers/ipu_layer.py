"""The add-on layers' refusal of the stock Keras arguments the IPU layers do not support
(AD ``keras/layers/ipu_layer.py``; reference §8 oracle 18)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_unsupported"]


def check_unsupported(layer: Any, arg: Any, arg_name: str, method: str = "__init__") -> None:
    """Raise when a truthy ``arg`` is given to an argument the IPU layer has only for API
    consistency with the stock Keras layer of the same name.

    Raises:
        NotImplementedError: "ipu_tensorflow_addons.keras.layers.<Layer> does not support
            <method> argument <arg_name>. It is included for API consistencywith
            keras.<Layer>." (the missing space is in the add-on's source; reference §8 #18).
    """
    if arg:
        name = layer if isinstance(layer, str) else type(layer).__name__
        raise NotImplementedError(
            f"ipu_tensorflow_addons.keras.layers.{name} does not support {method} argument "
            f"{arg_name}. It is included for API consistencywith keras.{name}.")
