"""Memory accounting of the simulated IPUs' In-Processor-Memory (SRAM).

Every tensor a program places on a simulated IPU is counted against that IPU's SRAM
(:attr:`ipu_node.device.IPU.sram_bytes`: 1472 tiles x 624 KiB on ipu2, seed 001:224-238).
Going over it raises :class:`~ipu_node.errors.IPUOutOfMemoryError` naming the IPU, the bytes
needed and available, and the largest tensors. Bytes are counted exactly (``array.nbytes``);
code, vertex state and exchange buffers of a real Poplar program are not modelled.

From inside a replica function::

    w = ipu_node.place(np.zeros((1024, 1024), np.float32), name="w")   # on the replica's IPU
    ipu_node.memory_usage()[ipu_id].peak_bytes
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

from ipu_node.device import IPU
from ipu_node.errors import IPUError, IPUOutOfMemoryError, UnknownIPUError

#: How many of the largest tensors an out-of-memory message names.
OOM_LARGEST_SHOWN = 5

_names = itertools.count()


@dataclass(frozen=True)
class MemoryUsage:
    """Memory of one IPU at one moment (all in bytes).

    Attributes:
        ipu_id: the IPU.
        in_use_bytes: bytes of the tensors placed now.
        peak_bytes: the largest ``in_use_bytes`` so far.
        capacity_bytes: the IPU's SRAM.
    """

    ipu_id: int
    in_use_bytes: int
    peak_bytes: int
    capacity_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.in_use_bytes


class IPUMemory:
    """The tensors placed on one simulated IPU. Thread-safe.

    Args:
        ipu: the IPU; its ``sram_bytes`` is the capacity.
    """

    def __init__(self, ipu: IPU):
        self.ipu_id = ipu.id
        self.capacity_bytes = ipu.sram_bytes
        self._tensors: dict[str, int] = {}
        self._in_use = 0
        self._peak = 0
        self._lock = threading.Lock()

    @property
    def in_use_bytes(self) -> int:
        return self._in_use

    @property
    def peak_bytes(self) -> int:
        return self._peak

    def tensors(self) -> dict[str, int]:
        """Name -> bytes of the tensors placed now."""
        with self._lock:
            return dict(self._tensors)

    def largest(self, k: int = OOM_LARGEST_SHOWN) -> list[tuple[str, int]]:
        """The ``k`` largest tensors, ``(name, nbytes)``, largest first."""
        with self._lock:
            return sorted(self._tensors.items(), key=lambda kv: (-kv[1], kv[0]))[:k]

    def allocate(self, name: str, nbytes: int, *, replace: bool = False) -> None:
        """Place tensor ``name`` of ``nbytes`` bytes.

        Args:
            replace: if ``name`` is already placed, replace it (its bytes are freed first);
                otherwise that is an error.

        Raises:
            ValueError: ``nbytes < 0``, or ``name`` is placed already and ``replace`` is False.
            IPUOutOfMemoryError: it does not fit; nothing changes.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0, got {nbytes!r}")
        with self._lock:
            old = self._tensors.get(name)
            if old is not None and not replace:
                raise ValueError(f"tensor {name!r} is already placed on IPU {self.ipu_id}; "
                                 "free it first or place it with replace=True")
            in_use = self._in_use - (old or 0)
            if in_use + nbytes > self.capacity_bytes:
                raise self._oom(name, nbytes, self.capacity_bytes - in_use)
            self._tensors[name] = nbytes
            self._in_use = in_use + nbytes
            self._peak = max(self._peak, self._in_use)

    def _oom(self, name: str, nbytes: int, available: int) -> IPUOutOfMemoryError:
        largest = sorted(self._tensors.items(), key=lambda kv: (-kv[1], kv[0]))
        largest = largest[:OOM_LARGEST_SHOWN]
        shown = ", ".join(f"{n!r} ({b:,} bytes)" for n, b in largest) or "none"
        return IPUOutOfMemoryError(
            f"IPU {self.ipu_id} is out of memory: tensor {name!r} needs {nbytes:,} bytes, "
            f"{available:,} of {self.capacity_bytes:,} bytes are available "
            f"({self._in_use:,} in use); largest tensors on IPU {self.ipu_id}: {shown}",
            ipu_id=self.ipu_id, needed_bytes=nbytes, available_bytes=available,
            largest=largest)

    def free(self, name: str) -> int:
        """Remove tensor ``name``; returns its bytes.

        Raises:
            KeyError: no tensor of that name on this IPU (the message says which IPU).
        """
        with self._lock:
            if name not in self._tensors:
                raise KeyError(f"no tensor {name!r} is placed on IPU {self.ipu_id}")
            nbytes = self._tensors.pop(name)
            self._in_use -= nbytes
            return nbytes

    def usage(self) -> MemoryUsage:
        with self._lock:
            return MemoryUsage(self.ipu_id, self._in_use, self._peak, self.capacity_bytes)

    def reset_peak(self) -> None:
        """Start a new peak from the current use."""
        with self._lock:
            self._peak = self._in_use


def _target(what: str, shard: int, ipu: int | None) -> IPUMemory:
    from ipu_node.replica import require_replica_context  # late: keeps this module light
    from ipu_node.system import get_system

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
    from ipu_node.system import get_system

    return {ipu_id: m.usage() for ipu_id, m in sorted(get_system().memory.items())}
