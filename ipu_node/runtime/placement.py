"""Placing tensors on the simulated IPUs of the configured system (``ipu_node.place``,
``free``, ``memory_usage``): the calls a program makes, over
:class:`~ipu_node.runtime.memory.IPUMemory` (kept apart from it: these need the configured system,
which itself holds the memories).
"""

from __future__ import annotations

import itertools
from typing import Any

from ipu_node.errors import IPUError, UnknownIPUError
from ipu_node.runtime.memory import IPUMemory, MemoryUsage
from ipu_node.runtime.replica import require_replica_context
from ipu_node.runtime.system import get_system

_names = itertools.count()


def _target(what: str, shard: int, ipu: int | None) -> IPUMemory:
    system = get_system()
    if ipu is None:
        ctx = require_replica_context(what)
        if isinstance(shard, bool) or not isinstance(shard, int) or not (
                0 <= shard < len(ctx.ipus)):
            raise IPUError(f"{what}: shard {shard!r} out of range; replica "
                           f"{ctx.replica_index} has {len(ctx.ipus)} IPUs")
        ipu = ctx.ipus[shard].id
    memory = system.memory.get(ipu)
    if memory is None:
        raise UnknownIPUError(f"{what}: IPU {ipu!r} is not attached by this process "
                              f"(attached: {sorted(system.memory)})")
    return memory


def _nbytes(array: Any) -> int:
    nbytes = getattr(array, "nbytes", None)
    if nbytes is None:
        import numpy as np
        nbytes = np.asarray(array).nbytes
    return int(nbytes)


def place(array: Any, name: str | None = None, *, shard: int = 0, ipu: int | None = None):
    """Account ``array`` as living on a simulated IPU and return it unchanged.

    Placing a name again replaces the tensor (e.g. a weight updated every step).

    Args:
        array: anything with ``nbytes`` (numpy arrays), or array-like.
        name: tensor name (unique per IPU); None gives a fresh name.
        shard: which of the current replica's IPUs (0 .. ipus_per_replica-1).
        ipu: an IPU id of this process instead (works outside replica functions).

    Raises:
        NotConfiguredError: no IPU system is configured.
        NotInReplicaError: outside a replica function without ``ipu``.
        IPUOutOfMemoryError: the IPU's SRAM would be exceeded.
    """
    memory = _target("ipu_node.place", shard, ipu)
    memory.allocate(name if name is not None else f"tensor{next(_names)}", _nbytes(array),
                    replace=True)
    return array


def free(name: str, *, shard: int = 0, ipu: int | None = None) -> int:
    """Remove tensor ``name`` from the replica's IPU ``shard`` (or IPU ``ipu``); returns bytes."""
    return _target("ipu_node.free", shard, ipu).free(name)


def memory_usage() -> dict[int, MemoryUsage]:
    """Current and peak bytes of every IPU of this process, by IPU id.

    Raises:
        NotConfiguredError: no IPU system is configured.
    """
    return {ipu_id: m.usage() for ipu_id, m in sorted(get_system().memory.items())}
