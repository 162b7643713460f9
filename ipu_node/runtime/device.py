"""Simulated IPUs and the TF devices (``/device:IPU:N``) that group them.

Hardware numbers (each from the seeds, see ``shared/reference/seeds-inventory.md`` §1.1):

* ``ipu2`` (GC200 / Bow): 1472 tiles (seed 001:224-227); "approximately 900MB" of SRAM
  (seed 000:61, 001:238). ipupod uses 624 KiB per tile: 1472 x 624 KiB = 940,572,672 bytes.
* ``ipu1`` (GC2): "~300 MB" of SRAM (seed 000:61). The 1216-tile count is from the GC2
  datasheet (outside the seeds); 1216 x 256 KiB = 318,767,104 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Standard tiles per IPU by version; ``ipu_model.tiles_per_ipu = 0`` selects these.
TILES_PER_IPU = {"ipu1": 1216, "ipu2": 1472}
#: In-Processor-Memory per tile, bytes.
SRAM_BYTES_PER_TILE = {"ipu1": 256 * 1024, "ipu2": 624 * 1024}


@dataclass(frozen=True)
class IPU:
    """One simulated IPU.

    Attributes:
        id: the physical IPU id (as ``gc-info`` numbers single IPUs).
        version: ``"ipu1"`` or ``"ipu2"``.
        tiles: number of tiles.
        sram_bytes: In-Processor-Memory capacity, bytes (tiles x bytes per tile).
    """

    id: int
    version: str
    tiles: int
    sram_bytes: int

    @classmethod
    def of_version(cls, ipu_id: int, version: str = "ipu2", tiles: int = 0) -> "IPU":
        """An IPU of ``version`` with ``tiles`` tiles (0: the version's standard count)."""
        if version not in TILES_PER_IPU:
            raise ValueError(f"unknown IPU version {version!r}; known: {sorted(TILES_PER_IPU)}")
        if tiles < 0:
            raise ValueError(f"tiles must be >= 0, got {tiles}")
        tiles = tiles or TILES_PER_IPU[version]
        return cls(ipu_id, version, tiles, tiles * SRAM_BYTES_PER_TILE[version])


@dataclass(frozen=True)
class IPUDevice:
    """A TF device ``/device:IPU:<ordinal>``: one or more IPUs attached together.

    Attributes:
        ordinal: N of ``/device:IPU:N``.
        ipus: the IPUs, in the order replicas and shards use them (the selection order).
        device_id: its ``gc-info -l`` device id, or None when its IPUs form no such device.
    """

    ordinal: int
    ipus: tuple[IPU, ...]
    device_id: int | None = None

    @property
    def name(self) -> str:
        return f"/device:IPU:{self.ordinal}"
