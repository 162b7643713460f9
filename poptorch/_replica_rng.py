"""A replica's random numbers: its own ``torch.Generator``, handed to each random operation
the replica runs, with no process-wide lock (poptorch reference §12).

Each replica draws from its own generator, seeded by the job's seed and its global replica
index, so its draws depend neither on the layout of the replicas over instances nor on the
order in which concurrent replica threads run. A random function that takes a ``generator``
(``torch.rand``, ``Tensor.bernoulli_``, ...: :data:`TAKES_GENERATOR`) gets the replica's;
one that does not (``F.dropout``, ``F.rrelu``, ``F.gumbel_softmax``, ...) runs under
:class:`_GeneratorMode`, a ``TorchDispatchMode`` (the dispatch mode stack is the thread's)
that hands the replica's generator to the ATen operations it is made of
(``aten.bernoulli_``, ``aten.rrelu_with_noise``, ``aten.exponential_``: each takes one).
``F.dropout``, the common one, is computed as ATen computes it, by the same operations with
the generator given (a dispatch mode costs a Python call per operation).

Bit for bit as before (PyTorch's default CPU generator set to the replica's state around the
operation, under a lock): a ``torch.Generator()`` is the same Mersenne Twister
(``CPUGeneratorImpl``) as the default one, and every ATen random kernel draws from the
generator it is given exactly as from the default (``get_generator_or_default``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from poptorch._errors import createPoptorchError

__all__ = ["ReplicaRNG", "TAKES_GENERATOR"]

#: random functions and tensor methods that take a ``generator`` keyword
TAKES_GENERATOR = frozenset(
    [getattr(torch, n) for n in ("rand", "randn", "randint", "randperm", "rand_like",
                                 "randn_like", "randint_like", "bernoulli", "multinomial",
                                 "normal", "poisson") if hasattr(torch, n)] +
    [getattr(torch.Tensor, n) for n in ("bernoulli", "bernoulli_", "uniform_", "normal_",
                                        "random_", "exponential_", "geometric_", "cauchy_",
                                        "log_normal_", "multinomial") if hasattr(torch.Tensor, n)])

_SEEDED = torch.Tag.nondeterministic_seeded
#: ATen operation -> whether it draws random numbers (it takes a generator, or raises)
_DRAWS: dict = {}


def _draws(op) -> bool:
    """Whether ``op`` draws random numbers.

    Raises:
        poptorch.Error: it draws without taking a generator.
    """
    draws = _DRAWS.get(op)
    if draws is None:
        draws = _SEEDED in op.tags
        if draws and not any(a.name == "generator" for a in op._schema.arguments):
            raise createPoptorchError(
                f"{op} draws random numbers without a generator: ipupod cannot give it the "
                "replica's (its random numbers would not be the replica's)")
        _DRAWS[op] = draws
    return draws


def _dropout(generator: torch.Generator, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """``F.dropout`` as ATen computes it on the CPU (``_dropout_impl``: a Bernoulli(1 - p)
    mask divided by 1 - p, times the input; the same operations, so the same values and
    gradients), drawing from ``generator``; None where ATen does anything else (``p`` 0 or
    1, not training, in place, an empty or non-strided tensor): the caller runs it."""
    names = ("input", "p", "training", "inplace")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    x, p = bound.get("input"), bound.get("p", 0.5)
    if (not isinstance(x, torch.Tensor) or type(x) is not torch.Tensor or
            not bound.get("training", True) or bound.get("inplace", False) or
            not isinstance(p, float) or not 0.0 < p < 1.0 or x.layout != torch.strided or
            x.device.type != "cpu" or not x.numel() or x.is_quantized or
            len(bound) > len(names)):
        return None
    noise = torch.empty_like(x).bernoulli_(1 - p, generator=generator)
    noise.div_(1 - p)
    return x * noise


class _GeneratorMode(TorchDispatchMode):
    """Gives ``generator`` to every ATen operation that takes one and got none, while active
    in this thread.

    Raises:
        poptorch.Error: a random ATen operation that takes no generator (it would draw from
            PyTorch's default generator, shared by every replica).
    """

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.generator = generator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _draws(func) and kwargs.get("generator") is None:
            kwargs = {**kwargs, "generator": self.generator}
        return func(*args, **kwargs)


class ReplicaRNG:
    """The random numbers of one replica (module docstring).

    Args:
        seed: the job's seed.
        replica: the global replica index.

    Attributes:
        generator: the replica's ``torch.Generator`` (CPU); use it only in the replica's
            thread.
    """

    __slots__ = ("generator", "_mode")

    def __init__(self, seed: int, replica: int):
        self.generator = torch.Generator()
        self.generator.manual_seed((int(seed) * 1_000_003 + replica) % (2 ** 63))
        self._mode = _GeneratorMode(self.generator)

    @property
    def state(self) -> torch.Tensor:
        """The generator's state (a ``torch.uint8`` tensor, as ``torch.get_rng_state``)."""
        return self.generator.get_state()

    @state.setter
    def state(self, value: torch.Tensor) -> None:
        self.generator.set_state(value)

    def call(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """``func(*args, **kwargs)`` drawing from this replica's generator (a generator given
        in ``kwargs`` is used as given)."""
        if func in TAKES_GENERATOR:
            if kwargs.get("generator") is None:
                kwargs = {**kwargs, "generator": self.generator}
            return func(*args, **kwargs)
        if func is F.dropout:  # (the common one: without a dispatch mode's cost per op)
            out = _dropout(self.generator, args, kwargs)
            if out is not None:
                return out
        with self._mode:
            return func(*args, **kwargs)
