"""Memory accounting of the simulated IPUs' In-Processor-Memory (SRAM).

Every tensor a program places on a simulated IPU is counted against that IPU's SRAM
(:attr:`ipu_node.runtime.device.IPU.sram_bytes`: 1472 tiles x 624 KiB on ipu2, seed 001:224-238).
Going over it raises :class:`~ipu_node.errors.IPUOutOfMemoryError` naming the IPU, the bytes
needed and available, and the largest tensors. Bytes are counted exactly (``array.nbytes``);
code, vertex state and exchange buffers of a real Poplar program are not modelled.

From inside a replica function::

    w = ipu_node.place(np.zeros((1024, 1024), np.float32), name="w")   # on the replica's IPU
    ipu_node.memory_usage()[ipu_id].peak_bytes
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ipu_node.errors import IPUOutOfMemoryError
from ipu_node.runtime.device import IPU

#: How many of the largest tensors an out-of-memory message names.
OOM_LARGEST_SHOWN = 5


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
        ipu: the IPU; its ``sram_bytes`` is the capacity unless ``capacity_bytes`` is given.
        capacity_bytes: the bytes tensors may use (the SRAM of the compute tiles when
            ``IPUConfig.io_tiles.num_io_tiles`` reserves some for I/O).
    """

    def __init__(self, ipu: IPU, capacity_bytes: int | None = None):
        self.ipu_id = ipu.id
        self.capacity_bytes = ipu.sram_bytes if capacity_bytes is None else capacity_bytes
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
