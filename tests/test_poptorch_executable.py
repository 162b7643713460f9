"""The compiled state of a model is one immutable Executable: compiling makes it, detaching
and attaching replace only its device's state, ``setOptimizer`` with another optimizer only
its replicas' optimizers, and nothing of it is cached in the options."""

import dataclasses

import pytest
import torch

import poptorch
from poptorch.execution._executable import Executable
from tests.poptorch_models import WithLoss, mlp


def _data(rows: int):
    return torch.randn(rows, 6), torch.randint(0, 3, (rows,))


def _fields(exe: Executable, *leave_out: str) -> dict:
    return {f.name: getattr(exe, f.name) for f in dataclasses.fields(exe)
            if f.name not in leave_out}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def test_compiling_makes_one_frozen_executable():
    model = poptorch.inferenceModel(mlp())
    model.compile(torch.zeros(2, 6))
    exe = model._executable
    assert isinstance(exe, Executable) and exe.attached and exe.device is model._device
    with pytest.raises(dataclasses.FrozenInstanceError):
        exe.device = None
    assert model.options._execution_strategy is None  # (the executable's, not the options')
    model.destroy()


def _trained():
    """A training model of an MLP after one call, and the MLP."""
    net = mlp()
    model = poptorch.trainingModel(WithLoss(net), poptorch.Options(),
                                   torch.optim.SGD(net.parameters(), lr=0.1))
    model(*_data(4))
    return model, net


def test_detach_and_attach_replace_only_the_device_state():
    model, _ = _trained()
    compiled = model._executable
    model.detachFromDevice()
    detached = model._executable
    assert detached is not compiled and not detached.attached and compiled.attached
    assert _same(_fields(detached, "attached"), _fields(compiled, "attached"))
    model.attachToDevice()
    again = model._executable
    assert again.attached and again.device is compiled.device
    assert _same(_fields(again, "attached"), _fields(compiled, "attached"))
    model.destroy()


def test_another_optimizer_replaces_only_the_replicas_optimizers():
    model, net = _trained()
    compiled = model._executable
    model.setOptimizer(torch.optim.SGD(net.parameters(), lr=0.05))
    now = model._executable
    assert now.optimizers is not compiled.optimizers and len(now.optimizers) == 1
    assert _same(_fields(now, "optimizers", "constants"),
                 _fields(compiled, "optimizers", "constants"))
    model(*_data(4))
    model.destroy()
