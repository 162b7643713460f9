"""How a collective operation's call reaches the engine (:mod:`collectives.ops` checks the
arguments): the call's descriptor and algorithm, made once per signature
(:func:`descriptor`); the plan of a one-replica instance's common call, found without
either (:func:`common`); a nest's fused buffers (:func:`call_nest`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from ipu_node import current_replica_context, require_replica_context

from collectives import _eager, _eager_move, _eager_reduce
from collectives import _fusion
from collectives import _nest
from collectives._arguments import members_of
from collectives._engine import MAX_PLANS
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives._runtime import get_engine

__all__ = ["algorithm", "descriptor", "common", "call", "is_nest", "call_nest", "sole_plans"]

#: descriptors (sequence number 0) and algorithm objects by call signature and replica
#: count: built (and validated) once; the engine keeps what it needs per descriptor
_descriptors: dict[tuple, tuple[Descriptor, _eager.Eager]] = {}


def descriptor(what: str, operator: str, dtype: np.dtype, shape: tuple[int, ...],
                group: CommGroup, name: str | None, params: tuple[str, ...],
                num_replicas: int, spec: tuple) -> tuple[Descriptor, _eager.Eager]:
    """The call's descriptor and its algorithm (``algorithm(spec[0], group, *spec[1:])``;
    the key's fields determine the spec)."""
    key = (what, operator, dtype, shape, group, name, params, num_replicas)
    found = _descriptors.get(key)
    if found is None:
        members_of(what, group, num_replicas)  # (a signature seen before has passed)
        desc = Descriptor(seq=0, op=what, operator=operator, dtype=dtype.name,
                          shape=tuple(shape), group=str(group), name=name or "",
                          params=params)
        if len(_descriptors) >= MAX_PLANS:
            _descriptors.clear()
        found = _descriptors[key] = (desc, algorithm(spec[0], group, *spec[1:]))
    return found


@lru_cache(maxsize=1024)
def algorithm(kind: str, group: CommGroup, *params) -> _eager.Eager:
    """The algorithm object of ``kind`` (``"allreduce"``, ``"reduce_scatter"`` with an
    operator; ``"all_gather"``; ``"all_to_all"`` with split and concat dimensions;
    ``"broadcast"`` with the root position) over ``group`` (:mod:`collectives._eager`);
    made once per arguments."""
    return _KINDS[kind](*params, group) if kind in ("allreduce", "reduce_scatter") \
        else _KINDS[kind](group, *params)


_KINDS = {"allreduce": _eager_reduce.AllReduce, "reduce_scatter": _eager_reduce.ReduceScatter,
          "all_gather": _eager_move.AllGather, "all_to_all": _eager_move.AllToAll,
          "broadcast": _eager_move.Broadcast}


#: the plans of one-replica instances' calls without a group or name argument (the common
#: call), by ``((op, its scalar arguments), the input's dtype, its shape)``: ``(replica
#: context, plan)`` (:class:`collectives._sole.SolePlan`). A call found here skips the argument
#: checks (its dtype and shape passed them at its first call), the descriptor look-up and
#: the engine's dispatch; its replica context tells that it runs in the same system.
sole_plans: dict[tuple, tuple] = {}


def common(x, size, group, name, key: tuple | None) -> tuple:
    """``(plan, sole_key)`` of a call with input ``x``, a size argument ``size``, ``group``
    and ``name`` (``key``: the op and its scalar arguments; None when they are not plain):
    the plan a one-replica instance made at an earlier such call, or None; and the key
    under which :func:`call` keeps the plan (None: not a common call: ``x`` is not an
    ndarray, or a size, group or name is given)."""
    if key is None or type(x) is not np.ndarray or size is not None or group is not None \
            or name is not None:
        return None, None
    found = sole_plans.get((key, x.dtype, x.shape))
    if found is not None and found[0] is current_replica_context() and found[1].live:
        return found[1], key
    return None, key


def call(what: str, arr: np.ndarray, group: CommGroup, name: str | None, spec: tuple,
          operator: str = "", params: tuple[str, ...] = (), sole_key: tuple | None = None
          ) -> np.ndarray:
    """One call of ``what`` on ``arr``; ``sole_key``: the call's key in
    :data:`sole_plans` before the dtype and shape (None: not a common call)."""
    ctx = require_replica_context(what)
    desc, algorithm = descriptor(what, operator, arr.dtype, arr.shape, group, name, params,
                                  ctx.num_replicas, spec)
    engine = get_engine()
    if engine.num_local_replicas != 1:
        return engine.replica_call(ctx.local_index, desc, arr, algorithm, group)
    plan = engine.sole_plan(desc, algorithm, arr, group)
    if sole_key is not None:
        if len(sole_plans) >= MAX_PLANS:
            sole_plans.clear()
        sole_plans[(sole_key, arr.dtype, arr.shape)] = (ctx, plan)
    return plan(arr)


#: the containers of a nest
_NESTS = (list, tuple, dict)


def is_nest(x) -> bool:
    """Whether ``x`` is a nest (a list, tuple or dict) rather than one array."""
    return isinstance(x, _NESTS)


def _leaves(what: str, x, check) -> tuple[list[np.ndarray], object]:
    """The arrays of nest ``x``, each through ``check(leaf) -> ndarray``, and the function
    that rebuilds the structure. An error of ``check`` names the array's place in ``x``."""
    leaves, rebuild = _nest.flatten(x)
    arrays = []
    for i, leaf in enumerate(leaves):
        try:
            arrays.append(check(leaf))
        except (TypeError, ValueError) as exc:
            where = f"{what}: x{_nest.leaf_paths(x)[i]}"
            message = str(exc)
            message = (where + message[len(what):] if message.startswith(what)
                       else f"{where}: {message}")
            raise type(exc)(message) from None
    return arrays, rebuild


def call_nest(what: str, x, group: CommGroup, name: str | None, spec: tuple, layout: str,
               check, operator: str = "", params: tuple[str, ...] = (),
               split_dimension: int = 0, concat_dimension: int = 0):
    """A collective on a nest: every array checked first (nothing is exchanged when one
    fails), then one engine call per fused buffer (:mod:`collectives._fusion`)."""
    ctx = require_replica_context(what)
    arrays, rebuild = _leaves(what, x, check)
    if not arrays:
        return rebuild([])
    k = len(members_of(what, group, ctx.num_replicas)[0])
    engine = get_engine()
    plan = _fusion.plan(tuple((a.dtype, a.shape) for a in arrays), layout, k,
                        engine.fusion.for_layout(layout))
    results: list = [None] * len(arrays)
    count = len(plan.buckets)
    for j, bucket in enumerate(plan.buckets):
        desc, algorithm = descriptor(
            what, operator, bucket.dtype, (bucket.length,), group, name,
            params + (f"nest {plan.fingerprint} {j + 1}/{count}",), ctx.num_replicas, spec)
        fused = _fusion.pack(bucket, arrays, layout, k, split_dimension)
        out = engine.replica_call(ctx.local_index, desc, fused, algorithm, group)
        for i, result in zip(bucket.indices, _fusion.unpack(
                bucket, out, layout, k, concat_dimension, split_dimension)):
            results[i] = result
    return rebuild(results)
