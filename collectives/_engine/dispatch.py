"""How a collective operation's call reaches its plan (:mod:`collectives.ops` checks the
arguments): the plan of the call's signature, made at its first call (:func:`plan`), and
kept for a one-replica instance's common call (:data:`collectives._engine.plan.common_plans`);
a nest's fused buffers (:func:`call_nest`).
"""

from __future__ import annotations

import numpy as np
from ipu_node import nest, require_replica_context

from collectives._engine import fusion as _fusion
from collectives._engine.arguments import members_of
from collectives._engine.engine import MAX_PLANS
from collectives._engine.alltoall import AllToAll
from collectives._engine.movement import Broadcast, Gather
from collectives._engine.plan import Plan, common_plans
from collectives._engine.reduction import Reduction
from collectives._engine.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives._engine.runtime import get_engine

__all__ = ["call", "call_nest", "host_plan", "is_nest", "plan", "steps"]


def steps(spec: tuple, group: CommGroup, dtype: np.dtype, shape: tuple[int, ...]):
    """``make_steps(engine, text)`` of a call (a :class:`~collectives._engine.plan.Plan`'s):
    ``spec`` is ``("allreduce", operator)``, ``("reduce_scatter", operator)``,
    ``("all_gather",)``, ``("all_to_all", split_dimension, concat_dimension)`` or
    ``("broadcast", root position)``."""
    kind, *params = spec
    if kind in ("allreduce", "reduce_scatter"):
        return lambda engine, text: Reduction(engine, text, params[0], group,
                                              kind == "reduce_scatter", dtype, shape)
    if kind == "all_gather":
        return lambda engine, text: Gather(engine, text, group, dtype, shape)
    if kind == "all_to_all":
        return lambda engine, text: AllToAll(engine, text, group, dtype, shape, *params)
    return lambda engine, text: Broadcast(engine, text, group, dtype, shape, *params)


def plan(engine, what: str, operator: str, dtype: np.dtype, shape: tuple[int, ...],
         group: CommGroup, name: str | None, params: tuple[str, ...], num_replicas: int,
         spec: tuple) -> Plan:
    """The plan of a call of ``what`` (its descriptor's fields; ``spec``: its steps, as
    :func:`steps`), made at the signature's first call, whose group it checks."""
    def make() -> Plan:
        members_of(what, group, num_replicas)
        desc = Descriptor(seq=0, op=what, operator=operator, dtype=dtype.name,
                          shape=tuple(shape), group=str(group), name=name or "",
                          params=params)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return Plan(engine, desc, steps(spec, group, dtype, tuple(shape)), nbytes, group)

    return engine.plan((what, operator, dtype, shape, group, name, params), make)


def host_plan(engine, what: str, operator: str, dtype: np.dtype, shape: tuple[int, ...],
              name: str, spec: tuple) -> Plan:
    """The plan of a call of the instance's host code (``strategy.broadcast``,
    ``strategy.reduce``) over every replica: op ``"host " + what``, group ALL."""
    group = CommGroup()

    def make() -> Plan:
        desc = Descriptor(0, f"host {what}", operator, dtype.name, tuple(shape), str(group),
                          name=name)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return Plan(engine, desc, steps(spec, group, dtype, tuple(shape)), nbytes, None,
                    host=True)

    return engine.plan(("host", what, operator, dtype, shape, name), make)


def call(what: str, arr: np.ndarray, group: CommGroup, name: str | None, spec: tuple,
         operator: str = "", params: tuple[str, ...] = (), common_key: tuple | None = None
         ) -> np.ndarray:
    """One call of ``what`` on ``arr``; ``common_key``: the call's key in
    :data:`common_plans` before the dtype and shape (None: not a common call)."""
    ctx = require_replica_context(what)
    engine = get_engine()
    found = plan(engine, what, operator, arr.dtype, arr.shape, group, name, params,
                 ctx.num_replicas, spec)
    if engine.num_local_replicas != 1:
        return engine.replica_call(ctx.local_index, found, arr)
    if common_key is not None:
        if len(common_plans) >= MAX_PLANS:
            common_plans.clear()
        common_plans[(common_key, arr.dtype, arr.shape)] = (ctx, found)
    return found.run((arr,))[0]


#: the containers of a nest
_NESTS = (list, tuple, dict)


def is_nest(x) -> bool:
    """Whether ``x`` is a nest (a list, tuple or dict) rather than one array."""
    return isinstance(x, _NESTS)


def _leaves(what: str, x, check) -> tuple[list[np.ndarray], object]:
    """The arrays of nest ``x``, each through ``check(leaf) -> ndarray``, and the
    structure's treedef (:mod:`ipu_node.nest`). An error of ``check`` names the array's
    place in ``x``."""
    leaves, treedef = nest.flatten(x)
    arrays = []
    for i, leaf in enumerate(leaves):
        try:
            arrays.append(check(leaf))
        except (TypeError, ValueError) as exc:
            where = f"{what}: x{nest.leaf_paths(x)[i]}"
            message = str(exc)
            message = (where + message[len(what):] if message.startswith(what)
                       else f"{where}: {message}")
            raise type(exc)(message) from None
    return arrays, treedef


def call_nest(what: str, x, group: CommGroup, name: str | None, spec: tuple, layout: str,
              check, operator: str = "", params: tuple[str, ...] = (),
              split_dimension: int = 0, concat_dimension: int = 0):
    """A collective on a nest: every array checked first (nothing is exchanged when one
    fails), then one call per fused buffer (:mod:`collectives._engine.fusion`), each of its
    signature's plan."""
    ctx = require_replica_context(what)
    arrays, treedef = _leaves(what, x, check)
    if not arrays:
        return nest.unflatten(treedef, [])
    k = len(members_of(what, group, ctx.num_replicas)[0])
    engine = get_engine()
    fusion = _fusion.fusion(tuple((a.dtype, a.shape) for a in arrays), layout, k,
                          engine.fusion.for_layout(layout))
    results: list = [None] * len(arrays)
    count = len(fusion.buckets)
    for j, bucket in enumerate(fusion.buckets):
        found = plan(engine, what, operator, bucket.dtype, (bucket.length,), group, name,
                     params + (f"nest {fusion.fingerprint} {j + 1}/{count}",),
                     ctx.num_replicas, spec)
        fused = _fusion.pack(bucket, arrays, layout, k, split_dimension)
        out = engine.replica_call(ctx.local_index, found, fused)
        for i, result in zip(bucket.indices, _fusion.unpack(
                bucket, out, layout, k, concat_dimension, split_dimension)):
            results[i] = result
    return nest.unflatten(treedef, results)
