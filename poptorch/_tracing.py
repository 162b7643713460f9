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
  which concurrent replica threads run): every random op is handed the replica's generator
  (:class:`poptorch._replica_rng.ReplicaRNG`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from poptorch._errors import createPoptorchError
from poptorch._forward_pass import current_pass
from poptorch._replica_rng import ReplicaRNG

__all__ = ["Trace", "record_identity_loss", "LOSS_FUNCTIONS", "RANDOM_FUNCTIONS"]

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

class Trace(TorchFunctionMode):
    """Records losses and routes random ops to ``rng`` while on torch's function mode stack
    (entered by a :class:`poptorch._forward_pass.ForwardPass`, which owns the thread state
    of a pass).

    Args:
        rng: the replica's random numbers, or None to use PyTorch's default generator.

    Attributes:
        intercept: whether the pass pushes it on the function mode stack (sees every op).
        follows_blocks: whether it is the forward the block annotations talk to (a
            :class:`~poptorch.pipelining._stage_trace.StageTrace`).
    """

    intercept = True
    follows_blocks = False

    def __init__(self, rng: ReplicaRNG | None = None):
        super().__init__()
        self.rng = rng
        self.losses: list[torch.Tensor] = []
        self.random_calls = 0

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
    forward = current_pass()
    trace = forward.trace if forward is not None else None
    if trace is not None:
        trace.losses.append(loss)
