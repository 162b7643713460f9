"""What one operation of a model takes on an IPU: the per-operation compute model (issue 30).

An operation is an :class:`OpRecord` (what the front end saw: its kind, its dimensions, its
dtype, the bytes it reads and writes); :func:`op_time` prices it on a
:class:`~ipu_node.chips.Chip` as the IPU runs it, in BSP supersteps of compute, sync and
exchange (seed 001:1106-1117), and :class:`ComputeProfile` prices a pass's operations and says
where the time goes. Times are modelled seconds (what the real IPU would take), never wall
time; sizes are bytes. Nothing here is fitted to a model's published throughput: the same
rules and constants price every workload (``compute_efficiency`` is an override of the whole
model, not an input of it).

**Matrix products and convolutions on the AMP units** (:func:`amp_time`). PopLibs lowers a
matmul ``[M, K] x [K, N]`` (and a convolution, as the implicit matrix product of its
``batch x output positions`` by ``input channels x kernel`` by ``output channels``) to
``ConvPartial`` vertices on the tiles' Accumulating Matrix Product (AMP) units:

* a tile's AMP does :func:`amp_macs_per_cycle` multiply-accumulates a cycle: the chip's peak
  over ``2 x tiles x clock`` (64 in float16, 16 in float32 on the GC200: the IPU-POD64
  datasheet's 249.7 / 62.4 TFLOPS per IPU, 1472 tiles, 1.33 GHz);
* it takes its input as 64-bit loads: ``CONV_UNIT_INPUT_LOAD_ELEMS_HALF = 4`` /
  ``_FLOAT = 2`` elements a cycle (PopLibs ``include/poplibs_support/TileConstants.hpp``),
  over a pipeline of :data:`AMP_PIPELINE_DEPTH` (PopLibs' ``convUnitPipelineDepth``), so an
  AMP pass takes input channels in groups of ``load x depth`` (16 half, 8 float: PopLibs'
  ``inChansPerGroup``) and makes ``macs / load`` output channels at once (16 half, 8 float:
  the conv units); a dimension that is not a multiple of its group is padded to one;
* each pass of one weight block over ``m`` output positions costs the AMP pipeline's warm-up
  (:data:`AMP_WARMUP_CYCLES`, PopLibs' ``get1x1ConvCycles``), loading the block's weights
  into the conv units (:data:`AMP_WEIGHT_LOAD_BYTES_PER_CYCLE`, ipupod assumption) and
  ``m x group / load`` cycles of streaming;
* the work is split over the tiles as PopLibs' planner splits it: over groups (a batched
  matmul's batch, a grouped convolution's groups), positions, output-channel groups and
  input-channel groups, the split that takes the fewest cycles (powers of two per
  dimension, their product at most the tile count); each tile receives its operands'
  slices over the exchange (:data:`EXCHANGE_BYTES_PER_CYCLE` per tile) before it computes,
  and a split over input channels adds a reduction of float32 partials (exchange, vector
  adds and one more superstep).

**Everything else by the bytes it moves** (:func:`vector_time`): element-wise,
normalisation, reduction and data-movement operations run on the tiles' vector units over
the operands' tiles, one 64-bit load or store a cycle per tile
(:data:`VECTOR_BYTES_PER_CYCLE`), plus a vertex's start (:data:`VERTEX_OVERHEAD_CYCLES`);
normalisations read their input once more for the statistics and take two supersteps
(statistics, then the normalisation), reductions two (partials, then across tiles);
data movement (copies, concatenations, gathers, embeddings, layout changes) goes through
the exchange. Views (reshape, transpose, slices of a view) cost nothing.

**Each superstep** adds a BSP sync (:data:`SYNC_CYCLES`, ipupod assumption). One PyTorch
(ATen) operation is one or more supersteps: ipupod assumes no fusion across operations.

The result of a pass: ``amp`` (matmul/conv on the AMP), ``vector`` (element-wise,
normalisation, reduction, data movement), ``exchange`` and ``sync`` seconds, and the
operations that took the most (:meth:`ComputeProfile.price`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from ipu_node.hardware.chips import Chip

__all__ = ["OpRecord", "OpTime", "ComputeProfile", "PricedProfile", "op_time", "amp_time",
           "vector_time", "amp_macs_per_cycle", "amp_groups", "KINDS", "CATEGORIES",
           "AMP_PIPELINE_DEPTH", "AMP_LOAD_ELEMS", "AMP_WARMUP_CYCLES",
           "AMP_WEIGHT_LOAD_BYTES_PER_CYCLE", "EXCHANGE_BYTES_PER_CYCLE",
           "VECTOR_BYTES_PER_CYCLE", "VERTEX_OVERHEAD_CYCLES", "SYNC_CYCLES",
           "PARTIALS_BYTES"]

#: Input elements one AMP load brings, per dtype: 64 bits (PopLibs
#: ``include/poplibs_support/TileConstants.hpp``: ``CONV_UNIT_INPUT_LOAD_ELEMS_HALF (4)``,
#: ``CONV_UNIT_INPUT_LOAD_ELEMS_FLOAT (2)``).
AMP_LOAD_ELEMS = {"float16": 4, "float32": 2}
#: Depth of the conv units' input pipeline (PopLibs' ``convUnitPipelineDepth = 4``): input
#: channels are taken ``load x depth`` at a time (16 half, 8 float: ``inChansPerGroup``).
AMP_PIPELINE_DEPTH = 4
#: Cycles to start an AMP pass over a run of output positions (PopLibs
#: ``PerformanceEstimation.hpp`` ``get1x1ConvCycles``: ``warmUpCycles = 19``).
AMP_WARMUP_CYCLES = 19
#: ipupod assumption: bytes a cycle the conv units' weights load at (one 64-bit load a
#: cycle, as the AMP's input path; PopLibs' own figure is not in the references).
AMP_WEIGHT_LOAD_BYTES_PER_CYCLE = 8
#: Exchange bytes a tile receives per cycle: the GC200's "IPU-Exchange 8 TB/s" (anchors
#: §2.5) over 1472 tiles at 1.33 GHz = 4.09; the Bow IPU's "11 TB/s all-to-all IPU-Exchange"
#: (seed 001:252-253) at 1.85 GHz = 4.04; Poplar's ``exchangeBytesPerCycle`` (anchors §6).
EXCHANGE_BYTES_PER_CYCLE = 4
#: ipupod assumption: bytes a tile's vector code moves per cycle: one 64-bit load or store
#: per instruction, one instruction a cycle over the tile's six worker threads (seed
#: 001:233-234: 6 threads per tile), the arithmetic dual-issued beside it. A third of the
#: datasheet's 47.5 TB/s (GC200, anchors §2.5: 24 bytes a cycle per tile, reached only by
#: paired 128-bit loads with a store).
VECTOR_BYTES_PER_CYCLE = 8
#: ipupod assumption: cycles to start the vertices of a compute set on a tile (supervisor
#: launch of its workers, worklist reads); no source gives a figure.
VERTEX_OVERHEAD_CYCLES = 100
#: ipupod assumption: cycles of one BSP sync of all the tiles of an IPU (the compute set's
#: end, before its exchange). Poplar's IPU Model has ``globalSyncCycles`` (anchors §6) but the
#: references give no value.
SYNC_CYCLES = 150
#: Bytes of an AMP partial sum: float32 (PopTorch/PopART's default partials type for
#: matmuls and convolutions; ``Precision.setPartialsType`` may make it float16).
PARTIALS_BYTES = {"float32": 4, "float16": 2}

#: Kinds of operation (an :class:`OpRecord`'s ``kind``).
KINDS = ("matmul", "conv", "elementwise", "normalisation", "reduction", "data movement",
         "view")
#: Where a pass's modelled time goes (:class:`PricedProfile`).
CATEGORIES = ("amp", "vector", "exchange", "sync")
_SPLITS = tuple(2 ** i for i in range(12))  # 1 .. 2048: enough for 1472 tiles


@dataclass(frozen=True)
class OpRecord:
    """One operation as the front end saw it (plain data, torch-free).

    Attributes:
        name: the operation's name (an ATen name, e.g. ``"mm"``, ``"convolution"``).
        kind: one of :data:`KINDS`.
        dtype: ``"float16"`` or ``"float32"`` (others count as float32 for the AMP).
        dims: ``matmul``: ``(groups, M, K, N)``; ``conv``: ``(groups, M, C_in, kernel
            elements, C_out)`` per group (``M``: batch x output positions); a batch norm
            computing statistics over its batch (training, forward and backward):
            ``(channels,)`` (:mod:`collectives.performance.step_model` prices a distributed
            batch norm's all-reduce of them); others: ``()``.
        nbytes: bytes read and written (operands and results).
        flops: FLOPs as PyTorch's flop counter counts them (0 for all but matmul/conv).
    """

    name: str
    kind: str
    dtype: str = "float32"
    dims: tuple = ()
    nbytes: int = 0
    flops: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"OpRecord.kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class OpTime:
    """Modelled seconds of one operation by where they go (:data:`CATEGORIES`)."""

    amp: float = 0.0
    vector: float = 0.0
    exchange: float = 0.0
    sync: float = 0.0

    @property
    def total(self) -> float:
        return self.amp + self.vector + self.exchange + self.sync


def _name(dtype) -> str:
    return "float16" if str(getattr(dtype, "name", dtype)) == "float16" else "float32"


def amp_macs_per_cycle(chip: Chip, dtype: str) -> int:
    """Multiply-accumulates a tile's AMP does a cycle in ``dtype``: the chip's peak FLOP/s
    over ``2 x tiles x clock`` (GC200: 64 float16, 16 float32; datasheet-derived)."""
    return round(chip.peak_flops(_name(dtype)) / (2 * chip.tiles * chip.clock_hz))


def amp_groups(chip: Chip, dtype: str) -> tuple[int, int, int]:
    """``(input channels per group, output channels per pass, cycles per output position
    of a pass)`` of the AMP in ``dtype`` (module docstring; GC200 float16: 16, 16, 4)."""
    load = AMP_LOAD_ELEMS[_name(dtype)]
    in_group = load * AMP_PIPELINE_DEPTH
    out_group = max(1, amp_macs_per_cycle(chip, dtype) // load)
    return in_group, out_group, in_group // load


def _amp_cycles(chip: Chip, dtype: str, groups: int, m: int, k_in: int, kernel: int, n: int,
                partials: str) -> tuple[float, float, float, int]:
    """(AMP cycles, exchange cycles, reduction vector cycles, supersteps) of the best split."""
    dtype = _name(dtype)
    return _best_split(chip.tiles, *amp_groups(chip, dtype), 2 if dtype == "float16" else 4,
                       groups, m, k_in, kernel, n, PARTIALS_BYTES[partials])


@functools.lru_cache(maxsize=65536)
def _best_split(tiles: int, in_group: int, out_group: int, per_pos: int, item: int,
                groups: int, m: int, k_in: int, kernel: int, n: int, pbytes: int):
    kb = math.ceil(k_in / in_group) * kernel          # weight blocks along K
    nb = math.ceil(n / out_group)                     # along N
    weight_load = in_group * out_group * item / AMP_WEIGHT_LOAD_BYTES_PER_CYCLE
    tg, tm, tn, tk = (np.array(s) for s in np.meshgrid(
        [s for s in _SPLITS if s <= max(groups, 1)], [s for s in _SPLITS if s <= max(m, 1)],
        [s for s in _SPLITS if s <= nb], [s for s in _SPLITS if s <= kb], indexing="ij"))
    fits = tg * tm * tn * tk <= tiles
    tg, tm, tn, tk = tg[fits], tm[fits], tn[fits], tk[fits]
    g_t, m_t = np.ceil(groups / tg), np.ceil(m / tm)
    n_t, k_t = np.ceil(nb / tn), np.ceil(kb / tk)
    amp = g_t * n_t * k_t * (AMP_WARMUP_CYCLES + weight_load + m_t * per_pos)
    received = g_t * k_t * in_group * (m_t + n_t * out_group) * item
    exchange = received / EXCHANGE_BYTES_PER_CYCLE
    # a split over K: every output element's tk partials meet on one tile and add up
    outputs = groups * m * n
    red_bytes = np.where(tk > 1, outputs * tk * pbytes + outputs * item, 0.0)
    tiles_used = np.minimum(tiles, tg * tm * tn * tk)
    reduce_vec = red_bytes / tiles_used / VECTOR_BYTES_PER_CYCLE
    reduce_exch = np.where(tk > 1, outputs * (tk - 1) * pbytes / tiles_used
                           / EXCHANGE_BYTES_PER_CYCLE, 0.0)
    total = amp + exchange + reduce_vec + reduce_exch + np.where(tk > 1, SYNC_CYCLES, 0)
    best = int(np.argmin(total))
    return (float(amp[best]), float(exchange[best] + reduce_exch[best]),
            float(reduce_vec[best]), 2 if tk[best] > 1 else 1)


def amp_time(chip: Chip, dtype: str, *, m: int, k: int, n: int, groups: int = 1,
             kernel: int = 1, partials: str = "float32") -> OpTime:
    """Modelled seconds of ``groups`` independent products ``[m, k * kernel] x
    [k * kernel, n]`` on the AMP units of one ``chip`` (module docstring): a matmul
    (``kernel=1``) or a convolution (``m`` = batch x output positions, ``k`` input channels
    per group, ``kernel`` kernel elements, ``n`` output channels per group).

    Raises:
        ValueError: a dimension < 1, or an unknown partials type.
    """
    if min(m, k, n, groups, kernel) < 1:
        raise ValueError(f"amp_time: dimensions must be >= 1, got m={m}, k={k}, n={n}, "
                         f"groups={groups}, kernel={kernel}")
    if partials not in PARTIALS_BYTES:
        raise ValueError(f"partials must be one of {tuple(PARTIALS_BYTES)}, got {partials!r}")
    amp, exch, red, steps = _amp_cycles(chip, _name(dtype), int(groups), int(m), int(k),
                                        int(kernel), int(n), partials)
    hz = chip.clock_hz
    return OpTime(amp=amp / hz, vector=red / hz, exchange=exch / hz,
                  sync=steps * SYNC_CYCLES / hz)


def vector_time(chip: Chip, kind: str, nbytes: float) -> OpTime:
    """Modelled seconds of a ``kind`` operation (element-wise, normalisation, reduction, data
    movement) moving ``nbytes`` through the tiles' memory (module docstring); views: 0."""
    if kind == "view" or nbytes <= 0:
        return OpTime()
    hz, tiles = chip.clock_hz, chip.tiles
    moved = nbytes * (4 / 3 if kind == "normalisation" else 1)  # the statistics' extra read
    # operands smaller than a 64-bit access per tile use fewer tiles
    used = max(1, min(tiles, math.ceil(nbytes / VECTOR_BYTES_PER_CYCLE)))
    vector = (VERTEX_OVERHEAD_CYCLES + moved / used / VECTOR_BYTES_PER_CYCLE) / hz
    steps = 2 if kind in ("normalisation", "reduction") else 1
    exchange = nbytes / 2 / used / EXCHANGE_BYTES_PER_CYCLE / hz if kind == "data movement" \
        else 0.0
    return OpTime(vector=vector, exchange=exchange, sync=steps * SYNC_CYCLES / hz)


def op_time(chip: Chip, op: OpRecord, *, dtype: str | None = None,
            partials: str = "float32") -> OpTime:
    """Modelled seconds of ``op`` on ``chip``; ``dtype`` overrides the op's own, scaling its
    bytes (a what-if: the same operations in another precision; a float16 program's operations
    are recorded as float16 already, :mod:`poptorch.execution._precision`)."""
    own = _name(op.dtype)
    use = _name(dtype) if dtype else own
    if op.kind in ("matmul", "conv") and not op.dims:  # shape unknown: FLOPs at peak
        return OpTime(amp=op.flops / chip.peak_flops(use))
    if op.kind == "matmul":
        g, m, k, n = op.dims
        return amp_time(chip, use, m=m, k=k, n=n, groups=g, partials=partials)
    if op.kind == "conv":
        g, m, k, kernel, n = op.dims
        return amp_time(chip, use, m=m, k=k, n=n, groups=g, kernel=kernel, partials=partials)
    scale = (2 if use == "float16" else 4) / (2 if own == "float16" else 4)
    return vector_time(chip, op.kind, op.nbytes * scale)


@dataclass(frozen=True)
class PricedProfile:
    """A pass's operations priced: seconds by category and the operations that took most.

    Attributes:
        total_s: modelled seconds of the pass.
        by_category: :data:`CATEGORIES` -> seconds.
        by_kind: op kind (``matmul/conv``, ``element-wise``, ...) -> seconds.
        top: ``(name, kind, count, seconds)`` of the costliest operations (by name and
            kind), most first.
        flops: FLOPs of the pass (matmul and convolution).
    """

    total_s: float
    by_category: Mapping[str, float]
    by_kind: Mapping[str, float]
    top: tuple
    flops: float


@dataclass(frozen=True)
class ComputeProfile:
    """The operations of one pass of one micro-batch, each with how many times it ran.

    Attributes:
        ops: ``((OpRecord, count), ...)``.
    """

    ops: tuple = ()

    @classmethod
    def of(cls, records: Iterable[OpRecord]) -> "ComputeProfile":
        """The profile of ``records`` (repeats counted)."""
        counts: dict[OpRecord, int] = {}
        for r in records:
            counts[r] = counts.get(r, 0) + 1
        return cls(tuple(counts.items()))

    def __add__(self, other: "ComputeProfile") -> "ComputeProfile":
        counts = dict(self.ops)
        for r, c in other.ops:
            counts[r] = counts.get(r, 0) + c
        return ComputeProfile(tuple(counts.items()))

    def to_plain(self) -> list:
        """Plain types (JSON): ``[[name, kind, dtype, dims, nbytes, flops, count], ...]``."""
        return [[r.name, r.kind, r.dtype, list(r.dims), r.nbytes, r.flops, c]
                for r, c in self.ops]

    @classmethod
    def from_plain(cls, plain) -> "ComputeProfile":
        """The inverse of :meth:`to_plain` (a profile passes through as it is).

        Raises:
            ValueError: an entry that is not ``[name, kind, dtype, dims, nbytes, flops, count]``.
        """
        if isinstance(plain, ComputeProfile):
            return plain
        try:
            return cls(tuple((OpRecord(str(n), str(k), str(d), tuple(int(x) for x in dims),
                                       int(b), float(f)), int(c))
                             for n, k, d, dims, b, f, c in plain))
        except (TypeError, ValueError) as e:
            raise ValueError(f"a compute profile is a list of [name, kind, dtype, dims, "
                             f"nbytes, flops, count]: {e}") from None

    def price(self, chip: Chip, *, dtype: str | None = None, partials: str = "float32",
              scale: float = 1.0, top: int = 8) -> PricedProfile:
        """The pass's modelled time on ``chip``: :func:`op_time` of every op times its
        count; ``scale`` multiplies the work (AMP, vector and exchange seconds, FLOPs) and
        not the syncs: the same pass at ``scale`` times the profiled micro-batch has the same
        supersteps (ipupod assumption: its shapes keep their efficiency)."""
        cats = dict.fromkeys(CATEGORIES, 0.0)
        kinds: dict[str, float] = {}
        per_op: dict[tuple[str, str], list] = {}
        flops = 0.0
        for op, count in self.ops:
            t = op_time(chip, op, dtype=dtype, partials=partials)
            seconds = (t.amp + t.vector + t.exchange) * scale + t.sync
            for c in CATEGORIES:
                cats[c] += getattr(t, c) * count * (1 if c == "sync" else scale)
            label = _KIND_LABEL[op.kind]
            kinds[label] = kinds.get(label, 0.0) + seconds * count
            entry = per_op.setdefault((op.name, label), [0, 0.0])
            entry[0] += count
            entry[1] += seconds * count
            flops += op.flops * count * scale
        ranked = sorted(((n, k, c, s) for (n, k), (c, s) in per_op.items() if s > 0),
                        key=lambda x: -x[3])
        return PricedProfile(total_s=sum(cats.values()), by_category=cats, by_kind=kinds,
                             top=tuple(ranked[:top]), flops=flops)


_KIND_LABEL = {"matmul": "matmul/conv", "conv": "matmul/conv", "elementwise": "element-wise",
               "normalisation": "normalisation", "reduction": "reduction",
               "data movement": "data movement", "view": "view"}
