"""horovod.torch's ``DistributedOptimizer`` and ``broadcast_optimizer_state``, over the
Horovod collectives of this package. Used only with torch optimizers: torch comes from
``sys.modules`` (the caller imported it), never imported here.

``DistributedOptimizer(optimizer, ...)`` returns, as horovod.torch does, an optimizer of a
new subclass of the optimizer's own class over the same parameter groups (so
``isinstance`` and learning-rate schedulers keep working), whose ``step()`` first averages
(``op``) the gradients over the ranks of the process set: ``synchronize()``, one fused
``grouped_allreduce`` of every gradient, in the order of the parameters' names (the same
on every rank), written back into ``p.grad``. Horovod starts each parameter's allreduce
from a hook as its gradient is ready and waits for them in ``synchronize()``; the numbers
are the same here (one reduction per step of the gradients accumulated over
``backward_passes_per_step`` passes), the overlap with the backward pass is not emulated.
A parameter whose gradient is None takes part with zeros (a rank may not have used it), as
Horovod. Hooks count the backward passes per parameter, so Horovod's errors stand: more
passes than ``backward_passes_per_step`` before ``step()``, or ``zero_grad()`` between
``backward()`` and ``step()``/``synchronize()``, raise its ``AssertionError``. With
``op=hvd.Adasum`` (more than one rank) ``step()`` is Horovod's delta optimizer: each rank
steps on its own gradients, and the parameters' changes are combined by Adasum.
"""

from __future__ import annotations

import sys
import warnings
from contextlib import contextmanager

from collectives.framework.horovod._call import Adasum, Average
from collectives.framework.horovod._compression import Compression
from collectives.framework.horovod._move import broadcast_parameters
from collectives.framework.horovod._object_ops import broadcast_object
from collectives.framework.horovod._reduce import grouped_allreduce
from collectives.framework.horovod._state import global_process_set, size
from collectives.framework.horovod._tensors import is_torch, torch_module

_PASSES_ERROR = ("Gradients were computed more than backward_passes_per_step times before "
                 "call to step(). Increase backward_passes_per_step to accumulate gradients "
                 "locally.")
_ZERO_GRAD_ERROR = ("optimizer.zero_grad() was called after loss.backward() but before "
                    "optimizer.step() or optimizer.synchronize(). This is prohibited as it "
                    "can cause a race condition.")


class _Distributed:
    """The methods of the distributed subclass (copied into it, as horovod.torch does)."""

    _hvd_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step,
                 op, gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                                for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, "
                             "parameter), usually produced by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found "
                             f"duplicates: {', '.join(dups)}")
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model "
                             "parameters were not named. Python object ids: "
                             f"{', '.join(str(i) for i in unnamed)}")
        ids = {id(v) for group in self.param_groups for v in group["params"]}
        self._named = sorted(((k, v) for k, v in named_parameters if id(v) in ids),
                             key=lambda kv: kv[0])
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._groups = groups
        self._passes = {id(v): 0 for _, v in self._named}
        self._synchronized = False
        self._should_synchronize = True
        if size() > 1:  # (as Horovod, whose hooks only a job of several ranks registers)
            for _, p in self._named:
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._counter(p))

    def _counter(self, p):
        def hook(_param):
            if self._passes[id(p)] >= self.backward_passes_per_step:
                raise AssertionError(_PASSES_ERROR)
            self._passes[id(p)] += 1
        return hook

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Allreduce after this many backward passes (horovod.torch's)."""
        self.backward_passes_per_step = passes
        self._passes = dict.fromkeys(self._passes, 0)

    def load_state_dict(self, *args, **kwargs):
        self._synchronized = False
        self._should_synchronize = True
        self._passes = dict.fromkeys(self._passes, 0)
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def synchronize(self) -> None:
        """Reduce every gradient over the process set (``op``), in place (module
        docstring). Collective: every rank of the set calls it."""
        torch = torch_module()
        if not self.process_set.included():
            self._synchronized = True
            return
        params = [p for _, p in self._named if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        pre, post = ((1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor)
                     if self.op == Average else (1.0, 1.0))
        compressed = [self._compression.compress(p.grad) for p in params]
        results = grouped_allreduce([c for c, _ in compressed], None, "DistributedOptimizer",
                                    Compression.none, self.op, pre, post, self.process_set)
        with torch.no_grad():
            for p, r, (_, ctx) in zip(params, results, compressed):
                p.grad.copy_(self._compression.decompress(r, ctx))
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """``step()`` inside does not synchronize (after an explicit ``synchronize()``, e.g.
        to clip the reduced gradients), as horovod.torch's."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self.op == Adasum and size() > 1:
            return self._adasum_step(closure)
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause "
                              "training slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _adasum_step(self, closure):
        """Horovod's delta optimizer: a local step, then the parameters' changes combined
        over the ranks by Adasum."""
        torch = torch_module()
        params = [p for _, p in self._named if p.requires_grad]
        starts = [p.detach().clone() for p in params]
        loss = super(self.__class__, self).step(closure)
        deltas = grouped_allreduce([p.detach() - s for p, s in zip(params, starts)], None,
                                   "DistributedOptimizer.adasum", Compression.none, Adasum,
                                   1.0, 1.0, self.process_set)
        with torch.no_grad():
            for p, s, d in zip(params, starts, deltas):
                p.copy_(s + d)
        self._passes = dict.fromkeys(self._passes, 0)
        return loss

    def zero_grad(self, *args, **kwargs):
        if any(self._passes.values()):   # (gradients since the last synchronize)
            raise AssertionError(_ZERO_GRAD_ERROR)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, op=Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False,
                         process_set=global_process_set):
    """horovod.torch's distributed optimizer (module docstring).

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``, naming every parameter of the
            optimizer (None: names by position).
        compression: ``hvd.Compression.none`` or ``.fp16``.
        backward_passes_per_step: backward passes whose gradients accumulate before the
            allreduce.
        op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum``.
        gradient_predivide_factor: with Average, the gradients are divided by it before the
            sum and multiplied by it / size after (Horovod's split of the average).
        num_groups, groups: Horovod's grouping of the allreduces; checked, no effect here
            (every gradient goes in one fused reduction).
        sparse_as_dense: accepted; sparse gradients are made dense either way.
        process_set: the ranks that average their gradients.

    Raises:
        TypeError: ``optimizer`` is not a torch optimizer.
        ValueError: Horovod's: predivide with another op, bad groups, unnamed or
            duplicate-named parameters.
    """
    if not is_torch_optimizer(optimizer):
        raise TypeError(f"DistributedOptimizer needs a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning, stacklevel=2)
        groups = num_groups if groups is None else groups
    if groups is not None:
        if not (isinstance(groups, list) or groups > 0):
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor.")
        if isinstance(groups, list):
            seen: set = set()
            for group in groups:
                for p in group:
                    if not is_torch(p):
                        raise ValueError("groups must consist of torch.Tensor.")
                    if id(p) in seen:
                        raise ValueError("A parameter can only appear once in groups.")
                    seen.add(id(p))
    if op == Adasum and process_set is not global_process_set and size() > 1:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    base = optimizer.__class__
    cls = type(base.__name__, (base,), {k: v for k, v in _Distributed.__dict__.items()
                                        if k not in ("__dict__", "__weakref__", "__qualname__")})
    return cls(optimizer.param_groups, named_parameters, compression,
               backward_passes_per_step, op, gradient_predivide_factor, groups,
               sparse_as_dense, process_set)


def is_torch_optimizer(obj) -> bool:
    """Whether ``obj`` is a ``torch.optim.Optimizer`` (torch imported by the caller)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.optim.Optimizer)


def broadcast_optimizer_state(optimizer, root_rank: int,
                              process_set=global_process_set) -> None:
    """The optimizer state of ``root_rank`` on every rank (horovod.torch's): a new
    optimizer's state is first made by one step with zero gradients (as Horovod; a
    :func:`DistributedOptimizer` steps without synchronizing), then its tensors (momentum
    buffers, Adam's moments and step) are broadcast in place in one fused broadcast, and its
    other values (scalars, and every parameter group's options: lr, betas, ...) as an
    object (:func:`collectives.framework.horovod.broadcast_object`). Collective.

    Raises:
        ValueError: ``torch.optim.LBFGS`` (Horovod's "cannot broadcast torch.optim.LBFGS
            state"); TypeError: not a torch optimizer.
    """

    if not is_torch_optimizer(optimizer):
        raise TypeError(f"broadcast_optimizer_state needs a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    torch = torch_module()
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        if getattr(optimizer, "_hvd_distributed", False):
            super(optimizer.__class__, optimizer).step()
        else:
            optimizer.step()
        state_dict = optimizer.state_dict()
    tensors, scalars = [], {}
    for index, group in enumerate(state_dict["param_groups"]):
        for pid in group["params"]:
            for name, value in state_dict["state"].get(pid, {}).items():
                if is_torch(value):
                    tensors.append((f"{index}.{pid}.{name}", value))
                else:
                    scalars[f"{pid}.{name}"] = value
    options = [{k: v for k, v in group.items() if k != "params"}
               for group in state_dict["param_groups"]]
    broadcast_parameters(tensors, root_rank, process_set)
    got = broadcast_object({"options": options, "scalars": scalars}, root_rank,
                           "broadcast_optimizer_state", process_set)
    for group, opts in zip(optimizer.param_groups, got["options"]):
        group.update(opts)
    for key, value in got["scalars"].items():
        pid, name = key.split(".", 1)
        state_dict["state"][int(pid)][name] = value
