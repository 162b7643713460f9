"""The inputs a model was compiled for, and the check that later calls match them
(poptorch reference §3.2, PT python/_args_parser.py): the number of positional arguments,
and for each argument its type, tensor dtype and shape, and the value of other arguments
(compiled in as constants)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from poptorch._errors import createPoptorchError

__all__ = ["CompiledInputs"]

_END = ("\nThis error occurred because the inputs passed at runtime don't match the inputs "
        "used to compile the model.\nTo recompile the model for the new inputs create a new "
        "inferenceModel / trainingModel wrapper or call destroy() on the curent one and try "
        "again.")


def _names(module: torch.nn.Module, count: int) -> list[str]:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(count):
        if i < len(params) and params[i].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        else:
            names.append(f"input {i}")
    return names


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.shape)
    if isinstance(value, (tuple, list)):
        return (type(value), [_describe(v) for v in value])
    if isinstance(value, dict):
        return (dict, {k: _describe(v) for k, v in value.items()})
    return ("value", type(value), value)


class CompiledInputs:
    """What the model was compiled with."""

    def __init__(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        self._names = _names(module, len(args))
        self._args = [_describe(a) for a in args]
        self._kwargs = {k: _describe(v) for k, v in kwargs.items()}

    def validate(self, args: tuple, kwargs: dict) -> None:
        """Raise when ``args``/``kwargs`` differ from the compiled inputs.

        Raises:
            poptorch.Error: "Number of positional arguments mismatch", "Type mismatch for",
                "Length mismatch for", "Keys mismatch for", "Data type mismatch for", "Shape
                mismatch for", "Value mismatch for" (each with PopTorch's explanation).
        """
        if len(args) != len(self._args):
            raise createPoptorchError(
                f"Number of positional arguments mismatch: expected {len(self._args)} "
                f"arguments but got {len(args)}.{_END}")
        for name, compiled, value in zip(self._names, self._args, args):
            self._check(name, compiled, value)
        self._check("named arguments", (dict, self._kwargs), kwargs)

    def _check(self, name: str, compiled: Any, value: Any) -> None:
        kind = compiled[0]
        if kind == "tensor":
            if not isinstance(value, torch.Tensor):
                raise createPoptorchError(f"Type mismatch for {name}: expected "
                                          f"{torch.Tensor} but got {type(value)}.{_END}")
            if value.dtype != compiled[1]:
                raise createPoptorchError(f"Data type mismatch for {name}: expected "
                                          f"{compiled[1]} but got {value.dtype}.{_END}")
            if value.shape != compiled[2]:
                raise createPoptorchError(f"Shape mismatch for {name}: expected "
                                          f"{compiled[2]} but got {value.shape}.{_END}")
        elif kind == "value":
            if type(value) is not compiled[1]:
                raise createPoptorchError(f"Type mismatch for {name}: expected {compiled[1]} "
                                          f"but got {type(value)}.{_END}")
            if value != compiled[2]:
                raise createPoptorchError(f"Value mismatch for {name}: expected "
                                          f"{compiled[2]} but got {value}.{_END}")
        elif kind is dict:
            if not isinstance(value, dict):
                raise createPoptorchError(f"Type mismatch for {name}: expected {dict} but got "
                                          f"{type(value)}.{_END}")
            if set(value) != set(compiled[1]):
                extra, missing = set(value) - set(compiled[1]), set(compiled[1]) - set(value)
                details = ([f"Unexpected arguments: {', '.join(sorted(extra))}"] if extra
                           else []) + ([f"Missing arguments: {', '.join(sorted(missing))}"]
                                       if missing else [])
                raise createPoptorchError(f"Keys mismatch for {name}: {'. '.join(details)}."
                                          f"{_END}")
            for key, sub in compiled[1].items():
                self._check(key if name == "named arguments" else f"{name}[{key}]", sub,
                            value[key])
        else:
            if type(value) is not kind:
                raise createPoptorchError(f"Type mismatch for {name}: expected {kind} but got "
                                          f"{type(value)}.{_END}")
            if len(value) != len(compiled[1]):
                raise createPoptorchError(f"Length mismatch for {name}: expected "
                                          f"{len(compiled[1])} elements but got {len(value)}."
                                          f"{_END}")
            for i, (sub, v) in enumerate(zip(compiled[1], value)):
                self._check(f"{name}[{i}]", sub, v)
