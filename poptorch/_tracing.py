"""What PopTorch learns by tracing a model, found while the eager model runs: its losses
and its random numbers (poptorch reference §5.3, §12).

:class:`Trace` is a ``TorchFunctionMode`` entered around a replica's forward pass:

* **Losses.** Results of PyTorch's loss functions (the ones PopTorch lowers to losses,
  PT poptorch/source/popart_canonicalization/LossOps.cpp:636-652) and of
  :func:`poptorch.identity_loss` are recorded; :meth:`Trace.final_loss` applies PopTorch's
  rule (PT poptorch/source/RemoveSurplusIdentityLosses.cpp:100-107): exactly one final loss,
  one that feeds no later loss, else ``"Couldn't find a loss in graph!"`` or ``"Multiple
  independent losses found in graph. ..."``.
* **Random numbers.** Each replica draws from its own generator (seeded by the job's seed
  and its global replica index, so the draws do not depend on the layout or on the order in
  which concurrent replica threads run): around every random op the replica's state is put
  into PyTorch's default generator under a process-wide lock and read back after.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from poptorch._errors import createPoptorchError

__all__ = ["Trace", "ReplicaRNG", "record_identity_loss", "LOSS_FUNCTIONS", "RANDOM_FUNCTIONS"]

#: PyTorch loss functions that PopTorch lowers to a loss
LOSS_FUNCTIONS = frozenset(getattr(F, name) for name in (
    "mse_loss", "l1_loss", "nll_loss", "cross_entropy", "smooth_l1_loss", "soft_margin_loss",
    "margin_ranking_loss", "hinge_embedding_loss", "cosine_embedding_loss",
    "triplet_margin_loss", "poisson_nll_loss", "multilabel_soft_margin_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "ctc_loss"))

#: functions and tensor methods that draw from PyTorch's default generator
RANDOM_FUNCTIONS = frozenset(
    [getattr(F, n) for n in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                             "feature_alpha_dropout", "rrelu", "gumbel_softmax")
     if hasattr(F, n)] +
    [getattr(torch, n) for n in ("rand", "randn", "randint", "randperm", "rand_like",
                                 "randn_like", "randint_like", "bernoulli", "multinomial",
                                 "normal", "poisson", "dropout", "rrelu") if hasattr(torch, n)] +
    [getattr(torch.Tensor, n) for n in ("bernoulli", "bernoulli_", "uniform_", "normal_",
                                        "random_", "exponential_", "geometric_", "cauchy_",
                                        "log_normal_", "multinomial") if hasattr(torch.Tensor, n)])

_rng_lock = threading.Lock()
_current = threading.local()


class ReplicaRNG:
    """The random state of one replica (a ``torch.Generator`` state, bytes).

    Args:
        seed: the job's seed.
        replica: the global replica index.
    """

    def __init__(self, seed: int, replica: int):
        generator = torch.Generator()
        generator.manual_seed((int(seed) * 1_000_003 + replica) % (2 ** 63))
        self.state = generator.get_state()

    def call(self, func, args, kwargs) -> Any:
        """``func(*args, **kwargs)`` drawing from this replica's state."""
        with _rng_lock:
            saved = torch.get_rng_state()
            torch.set_rng_state(self.state)
            try:
                return func(*args, **kwargs)
            finally:
                self.state = torch.get_rng_state()
                torch.set_rng_state(saved)


class Trace(TorchFunctionMode):
    """Records losses and routes random ops to ``rng`` while active in this thread.

    Args:
        rng: the replica's random state, or None to use PyTorch's default generator.
    """

    def __init__(self, rng: ReplicaRNG | None = None):
        super().__init__()
        self.rng = rng
        self.losses: list[torch.Tensor] = []
        self.random_calls = 0

    def __enter__(self):
        self._previous = getattr(_current, "trace", None)
        _current.trace = self
        return super().__enter__()

    def __exit__(self, *exc):
        _current.trace = self._previous
        return super().__exit__(*exc)

    def suspend(self) -> None:
        """Step out of this trace inside its ``with`` block (a forward pass that pauses lets
        other code run in its thread: the mode stack and the current trace are the thread's),
        :meth:`resume` steps back in.

        Raises:
            poptorch.Error: this trace is not the thread's innermost torch function mode or
                its current trace (a mode entered inside a block and still active where the
                forward pass pauses, at the next block): stepping out would drop that one.
        """
        depth = torch._C._len_torch_function_stack()
        top = torch._C._get_function_stack_at(depth - 1) if depth else None
        if top is not self or getattr(_current, "trace", None) is not self:
            raise createPoptorchError(
                "A pipelined forward pass pauses at the start of a block with "
                f"{type(top).__name__ if top is not None else 'no torch function mode'} "
                "active inside it: leave every TorchFunctionMode (and poptorch context) "
                "entered in a block before the next block begins")
        _current.trace = self._previous
        super().__exit__(None, None, None)

    def resume(self) -> None:
        super().__enter__()
        _current.trace = self

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in RANDOM_FUNCTIONS:
            self.random_calls += 1
            out = self.rng.call(func, args, kwargs) if self.rng is not None else \
                func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if func in LOSS_FUNCTIONS and isinstance(out, torch.Tensor):
            self.losses.append(out)
        return out

    def final_loss(self) -> torch.Tensor:
        """The one final loss of the forward pass.

        Raises:
            poptorch.Error: no loss ("Couldn't find a loss in graph!"), or more than one
                that feeds no later loss.
        """
        losses = [loss for loss in self.losses if loss.requires_grad]
        if not losses:
            raise createPoptorchError("Couldn't find a loss in graph!")
        if len(losses) == 1:
            return losses[0]
        finals = [loss for i, loss in enumerate(losses)
                  if not any(_feeds(loss, later) for later in losses[i + 1:])]
        if len(finals) != 1:
            raise createPoptorchError(
                "Multiple independent losses found in graph. Graph must have one final loss. "
                "Wrap final graph loss in poptorch.identity_loss.")
        return finals[0]


def _feeds(earlier: torch.Tensor, later: torch.Tensor) -> bool:
    """Whether ``earlier`` is an input (through any ops) of ``later``'s autograd graph."""
    target = earlier.grad_fn
    if target is None:
        return False
    seen, stack = set(), [later.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        if node is target:
            return True
        seen.add(id(node))
        stack.extend(n for n, _ in node.next_functions)
    return False


def record_identity_loss(loss: torch.Tensor) -> None:
    """Mark ``loss`` as a loss of the forward pass running in this thread (if traced)."""
    trace = getattr(_current, "trace", None)
    if trace is not None:
        trace.losses.append(loss)
