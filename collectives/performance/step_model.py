"""The whole-step model: how long one training step takes on a POD, and why.

Plain Python data, usable without running anything: a :class:`ModelCard` (what the model
is), a :class:`StepConfig` (how it is laid out on which POD), :func:`predict` (the
:class:`StepEstimate`) and :func:`what_if` (the same step on another configuration).
Hardware numbers come from :mod:`ipu_node.chips` (datasheets) and the collective cost model
(:mod:`collectives.performance.cost_model`); nothing is fitted to measured throughput. Times are
modelled seconds (what the real POD would take).

**The step** of one replica: ``gradient_accumulation`` micro-batches of ``micro_batch``
items, then one all-reduce of the gradients and one weight update:

* ``compute``: ``gradient_accumulation`` micro-batches on the slowest pipeline stage. A card
  with ``compute_ops`` (PopTorch's ``modelReport()``: the operations of each IPU of the
  replica) is priced per operation on the system's chip
  (:mod:`collectives.performance.compute_model`: matmuls and convolutions on the AMP units
  by shape, the other operations by the bytes they move, each superstep's exchange and sync),
  each operation at the dtype it was recorded in (a float16 program's in float16) with the
  card's ``partials``, its work scaled linearly from the micro-batch it was counted
  at to the config's, its syncs not (ipupod assumption: the shapes' efficiency at the
  counted micro-batch holds);
  ``efficiency`` given overrides it. Otherwise, and for hand-written cards:
  ``share_j * flops_per_item * micro_batch / (peak(dtype) * efficiency)`` for stage ``j``
  on its own IPU (``stage_shares``; one stage: the whole replica on one IPU). ``dtype`` is
  the card's ``grad_dtype`` (float16 models compute in FP16.16).
* ``norm_allreduce``: with the card's ``distributed_batch_norm_replica_group_size`` > 1
  (TF-IPU's distributed batch norm; Graphcore's MLPerf ResNet-50 sets 2), every batch norm
  of ``compute_ops`` that computes statistics (forward, its recomputation, backward) sums
  them over its group of replicas each time it runs:
  :data:`BATCH_NORM_STAT_BYTES_PER_CHANNEL` bytes a channel through the cost model's
  ``cross_replica_sum`` among CONSECUTIVE groups, and a BSP sync, per micro-batch on the
  IPU holding the batch norm.
* ``stream_copy``: each micro-batch's input (``input_bytes_per_item * micro_batch``) copied
  into the first stage's IPU from the prefetch staging area in Streaming Memory, at the IPU's
  share of its machine's Streaming Memory bandwidth over its PCIe link, plus a PCIe latency.
  Without IO tiles (``io_tiles == 0``, every framework's default) the IPU computes nothing
  meanwhile ("By default, while PopART is streaming data to and from an IPU, no other
  computation can occur on the IPU until the data transfer is complete", PopART User Guide,
  "Overlapping IO with compute"; TF-IPU: IO tiles overlap I/O and compute, "Efficient IPU
  I/O"), so the copy adds to the micro-batch; with IO tiles only what the IPU's compute does
  not cover.
* ``bubble``: the pipeline's ramp-up and ramp-down, ``(stages - 1)`` micro-batches of the
  slowest stage (its compute, batch-norm all-reduces and stream copy; a grouped pipeline,
  TF-IPU's ``Grouped`` schedule); 0 without pipelining.
* ``allreduce``: the gradients (``params * itemsize(grad_dtype)``) summed over the
  replicas, each stage's share on its own IPU at once
  (:meth:`~collectives.performance.cost_model.HardwareCostModel.estimate_shares`), the cheapest
  schedule the cost model knows (``auto``). Not overlapped with compute: with gradient
  accumulation it runs once, after the last micro-batch.
* ``weight_update``: the optimizer's arithmetic (:data:`WEIGHT_UPDATE_FLOPS_PER_PARAM` in
  float32), and for ``optimizer_state_in='streaming'`` the optimizer state read from and
  written back to Streaming Memory (``offload_weight_update_variables``) over each IPU's
  share of its machine's Streaming Memory bandwidth.
* ``host_io``: the input bytes of the step from the host to the first stage's IPU, over the
  IPU-Machine's 100 GbE shared by its IPUs (:attr:`ipu_node.chips.Chip.host_bytes_per_s_per_machine`).
  It overlaps compute and the stream copies (the infeed prefetches the next micro-batches
  into Streaming Memory):
  only ``host_io_exposed = max(0, host_io - compute - norm_allreduce - stream_copy -
  bubble)`` adds to the step.

``step_s = compute + norm_allreduce + stream_copy + bubble + host_io_exposed + allreduce +
weight_update``;
``samples_per_s = replicas * micro_batch * gradient_accumulation * samples_per_item / step_s``.

Left out: (without ``compute_ops``) BSP sync latency and on-chip exchange inside a pass (in
``efficiency``), the
forward/backward split of a stage, recomputation, activations spilled to Streaming Memory,
memory capacity checks, host-side data loading, and the number of host instances (it changes
nothing the POD does: :class:`StepConfig` accepts it to check it divides the replicas).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ipu_node.hardware.chips import Chip, chip_of_system
from ipu_node.hardware.links import PCIE_LATENCY_S
from ipu_node.hardware.systems import canonical_system_name, get_system_model

from collectives.performance.compute_model import SYNC_CYCLES
from collectives.performance.cost_model import HardwareCostModel
from collectives.performance.model_card import ModelCard, _positive

__all__ = ["ModelCard", "StepConfig", "StepEstimate", "predict", "what_if",
           "DEFAULT_EFFICIENCY", "WEIGHT_UPDATE_FLOPS_PER_PARAM", "TERMS",
           "BATCH_NORM_STAT_BYTES_PER_CHANNEL"]

#: Fraction of the peak FLOP/s a training pass sustains when ``predict`` is given none.
#: ipupod assumption, the same default as ``IPUConfig.execution.compute_efficiency``: no
#: measured figure in the seeds or anchors; half of peak sits between dense matmuls (near
#: peak) and whole models with normalisation and element-wise ops (well below). Not fitted.
DEFAULT_EFFICIENCY = 0.5
#: FLOPs per parameter of a weight update (LAMB/Adam-class: moments, norms, the update;
#: SGD needs fewer). ipupod assumption, a round figure; the term is small beside the others.
WEIGHT_UPDATE_FLOPS_PER_PARAM = 10
#: The terms every breakdown has, in table order.
TERMS = ("compute", "norm_allreduce", "stream_copy", "bubble", "host_io_exposed", "allreduce",
         "weight_update")
#: Bytes a distributed batch norm all-reduces per channel each time it runs: two float32
#: sums (forward: of its inputs and their squares; backward: of the gradient and of the
#: gradient times the normalised input), from which each replica group derives the mean and
#: variance (their gradients). ipupod assumption: the statistics reduced in float32, as
#: popnn computes them (float partials); the references give no layout.
BATCH_NORM_STAT_BYTES_PER_CHANNEL = 8

_CHANGES = ("system", "replicas", "ipus_per_replica", "micro_batch", "gradient_accumulation",
            "instances")


@dataclass(frozen=True)
class StepConfig:
    """How a step is laid out: ``replicas`` replicas of ``ipus_per_replica`` IPUs on
    ``system`` (the chip follows from the system, :func:`ipu_node.chips.chip_of_system`),
    ``micro_batch`` items per micro-batch, ``gradient_accumulation`` micro-batches per step,
    ``instances`` host processes (checked to divide ``replicas``; it changes no modelled time).

    Raises:
        ValueError, UnknownSystemError: an unknown system, a count < 1, more IPUs than the
            system has, or instances that do not divide the replicas.
    """

    system: str
    replicas: int
    ipus_per_replica: int = 1
    micro_batch: int = 1
    gradient_accumulation: int = 1
    instances: int = 1

    def __post_init__(self):
        canonical_system_name(self.system)
        for name in ("replicas", "ipus_per_replica", "micro_batch", "gradient_accumulation",
                     "instances"):
            _positive(f"StepConfig.{name}", getattr(self, name), integer=True)
        need = self.replicas * self.ipus_per_replica
        have = get_system_model(self.system).num_ipus
        if need > have:
            raise ValueError(f"{self.replicas} replicas x {self.ipus_per_replica} IPUs = {need} "
                             f"IPUs do not fit {self.system} ({have} IPUs)")
        if self.replicas % self.instances:
            raise ValueError(f"StepConfig: {self.replicas} replicas cannot be divided evenly "
                             f"among {self.instances} instances")

    @property
    def system_name(self) -> str:
        """``system`` as the registry spells it (e.g. ``"POD64"`` for ``"pod64"``)."""
        return canonical_system_name(self.system)

    @property
    def chip(self) -> Chip:
        """The chip of the system (:func:`ipu_node.chips.chip_of_system`)."""
        return chip_of_system(self.system)


@dataclass(frozen=True)
class StepEstimate:
    """The modelled step: ``step_s``, ``samples_per_s`` and ``breakdown`` (term -> seconds:
    :data:`TERMS` plus ``host_io``, the whole host transfer of which ``host_io_exposed`` is
    not hidden behind compute), the all-reduce's schedule (``allreduce_method``) and the
    assumptions it rests on. Priced per operation (a card with ``compute_ops``), the step's
    compute on the slowest IPU by kind of operation (``compute_breakdown``: matmul/conv,
    element-wise, normalisation, reduction, data movement), by where the time goes
    (``compute_categories``: amp, vector, exchange, sync) and the costliest operations
    (``top_ops``: ``(name, kind, count per micro-batch, seconds per step)``)."""

    card: ModelCard
    config: StepConfig
    efficiency: float
    step_s: float
    samples_per_s: float
    breakdown: dict = field(compare=False)
    allreduce_method: str = ""
    assumptions: tuple[str, ...] = ()
    compute_breakdown: dict = field(default_factory=dict, compare=False)
    compute_categories: dict = field(default_factory=dict, compare=False)
    top_ops: tuple = field(default=(), compare=False)

    def table(self) -> str:
        """The breakdown as a text table: every term with its seconds and share of the step,
        the all-reduce's schedule, samples per second and the assumptions."""
        c, b = self.config, self.breakdown
        lines = [f"{c.system_name} ({c.chip.name}): {c.replicas} replicas x {c.ipus_per_replica} "
                 f"IPU, micro-batch {c.micro_batch}, gradient accumulation "
                 f"{c.gradient_accumulation}, {c.instances} instance(s)",
                 f"  {'term':<34}{'ms':>10}{'% step':>8}"]
        names = {
            "compute": "compute",
            "norm_allreduce": "batch-norm all-reduces",
            "stream_copy": "input stream copies",
            "bubble": "pipeline bubble",
            "host_io_exposed": f"host I/O not hidden (of {b['host_io'] * 1e3:.3f} ms)",
            "allreduce": "all-reduce",
            "weight_update": "weight update" + (" (+ Streaming Memory)"
                                                if self.card.optimizer_state_in == "streaming"
                                                else ""),
        }
        for term in TERMS:
            lines.append(f"  {names[term]:<34}{b[term] * 1e3:>10.3f}"
                         f"{100 * b[term] / self.step_s:>8.1f}")
        lines.append(f"  {'step':<34}{self.step_s * 1e3:>10.3f}{100.0:>8.1f}")
        if self.compute_breakdown:
            total = sum(self.compute_breakdown.values()) or 1.0
            lines.append("  compute by operation: " + ", ".join(
                f"{k} {v * 1e3:.3f} ms ({100 * v / total:.0f}%)"
                for k, v in sorted(self.compute_breakdown.items(), key=lambda x: -x[1])))
            lines.append("  compute by unit: " + ", ".join(
                f"{k} {v * 1e3:.3f} ms" for k, v in self.compute_categories.items()))
            lines.append("  top operations: " + "; ".join(
                f"{n} ({k}, x{c}) {s * 1e3:.3f} ms" for n, k, c, s in self.top_ops[:5]))
        lines.append(f"  all-reduce schedule: {self.allreduce_method}")
        lines.append(f"  samples/s: {self.samples_per_s:,.0f}")
        lines += [f"  assumption: {a}" for a in self.assumptions]
        return "\n".join(lines)


def predict(card: ModelCard, config: StepConfig, efficiency: float | None = None
            ) -> StepEstimate:
    """The modelled training step of ``card`` laid out as ``config`` (module docstring).

    Args:
        efficiency: fraction of peak FLOP/s sustained, in (0, 1]; None:
            :data:`DEFAULT_EFFICIENCY`.

    Raises:
        ValueError: ``efficiency`` outside (0, 1], stage shares that do not match the IPUs,
            or replicas that are not a multiple of the card's
            ``distributed_batch_norm_replica_group_size``.
    """
    eff = DEFAULT_EFFICIENCY if efficiency is None else efficiency
    if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1:
        raise ValueError(f"efficiency must be a number in (0, 1], got {efficiency!r}")
    chip = config.chip
    shares = card.shares_for(config.ipus_per_replica)
    stages = len(shares)
    peak = chip.peak_flops(card.grad_dtype)
    per_op = bool(card.compute_ops) and efficiency is None
    priced = None
    if per_op:
        priced = _priced_stages(card, config, shares)
        stage_s = [p.total_s for p in priced]
    else:
        stage_s = [s * card.flops_per_item * config.micro_batch / (peak * eff) for s in shares]

    cost = None
    if config.replicas > 1:
        cost = HardwareCostModel.for_replicas(get_system_model(config.system), config.replicas,
                                              config.ipus_per_replica)
    norm_s = _norm_allreduce_stage_s(card, config, shares, cost, chip)
    stream = _stream_copy_s(card, config, chip)
    # each micro-batch's input streams into the first IPU; without IO tiles it computes
    # nothing meanwhile, with them the copy overlaps its compute
    exposed_stream = stream if not card.io_tiles else max(0.0, stream - stage_s[0] - norm_s[0])
    totals = [c + n + (exposed_stream if j == 0 else 0.0)
              for j, (c, n) in enumerate(zip(stage_s, norm_s))]
    slow = max(range(stages), key=lambda j: totals[j])
    micro_s = totals[slow]
    g = config.gradient_accumulation
    compute = g * stage_s[slow]
    norm = g * norm_s[slow]
    stream_copy = g * (exposed_stream if slow == 0 else 0.0)
    bubble = (stages - 1) * micro_s

    grad_shares = [round(s * card.grad_bytes) for s in shares]
    method = "none (one replica)"
    allreduce = 0.0
    if cost is not None:
        allreduce = cost.estimate_shares("cross_replica_sum", grad_shares)
        method = cost.choose("cross_replica_sum", grad_shares[0])[1]

    params_ipu = max(shares) * card.params
    update = params_ipu * WEIGHT_UPDATE_FLOPS_PER_PARAM / (chip.peak_flops("float32") * eff)
    if card.optimizer_state_in == "streaming" and card.optimizer_state_bytes_per_param:
        state = params_ipu * card.optimizer_state_bytes_per_param
        update += 2 * state / chip.streaming_memory_bytes_per_s_per_ipu  # read + write back

    host_io = _host_io_s(card, config, chip)
    exposed = max(0.0, host_io - compute - norm - stream_copy - bubble)
    breakdown = {"compute": compute, "norm_allreduce": norm, "stream_copy": stream_copy,
                 "bubble": bubble, "host_io": host_io, "host_io_exposed": exposed,
                 "allreduce": allreduce, "weight_update": update}
    step = compute + norm + stream_copy + bubble + exposed + allreduce + update
    samples = (config.replicas * config.micro_batch * config.gradient_accumulation
               * card.samples_per_item)
    slowest = priced[slow] if priced else None
    return StepEstimate(card=card, config=config, efficiency=eff, step_s=step,
                        samples_per_s=samples / step if step else float("inf"),
                        breakdown=breakdown, allreduce_method=method,
                        assumptions=_assumptions(card, config, eff, efficiency, per_op, peak),
                        compute_breakdown={k: v * g for k, v in slowest.by_kind.items()}
                        if slowest else {},
                        compute_categories={k: v * g for k, v in slowest.by_category.items()}
                        if slowest else {},
                        top_ops=tuple((n, k, c, s * g) for n, k, c, s in slowest.top)
                        if slowest else ())


def _assumptions(card: ModelCard, config: StepConfig, eff: float, efficiency, per_op: bool,
                 peak: float) -> tuple[str, ...]:
    """The assumptions a :class:`StepEstimate` prints under its table."""
    chip = config.chip
    compute_how = (
        f"compute per operation on the {chip.name} at each operation's dtype, "
        f"{card.partials} partials "
        f"(collectives.performance.compute_model: AMP by shape, the rest by bytes, exchange "
        f"and sync per superstep; counted at micro-batch {card.compute_micro_batch}, scaled "
        f"to {config.micro_batch})" if per_op else
        f"compute at {eff:g} of peak {card.grad_dtype} FLOP/s "
        f"({peak / 1e12:.1f} TFLOPS per {chip.name})"
        + (" (DEFAULT_EFFICIENCY, ipupod assumption)" if efficiency is None else ""))
    stream_how = (
        f"each micro-batch's input streams into the first IPU from the prefetch staging area "
        f"in Streaming Memory at {_stream_bytes_per_s(chip) / 1e9:.1f} GB/s, "
        + ("overlapping compute (IO tiles)" if card.io_tiles else
           "the IPU computing nothing meanwhile (no IO tiles)")
        + "; host I/O over the host network overlaps it and compute (prefetch)")
    return (
        compute_how,
        stream_how,
        "all-reduce and weight update once per step, after the last micro-batch",
        "IPU-Link/GW-Link latencies are ipupod assumptions; bandwidths from the datasheets",
    ) + (("Streaming Memory bandwidth (51.2 GB/s per machine) is an ipupod assumption",)
         if card.optimizer_state_in == "streaming" or card.input_bytes_per_item else ()) + (
        (f"batch-norm statistics all-reduced over groups of "
         f"{card.distributed_batch_norm_replica_group_size} replicas each time a batch norm "
         f"runs ({BATCH_NORM_STAT_BYTES_PER_CHANNEL} bytes a channel)",)
        if card.distributed_batch_norm_replica_group_size > 1 else ())


def _priced_stages(card: ModelCard, config: StepConfig, shares) -> list:
    """The :class:`~collectives.performance.compute_model.PricedProfile` of one micro-batch on
    each IPU of a replica: each IPU's operations priced on the config's chip at their own
    dtypes and the card's partials type, scaled from the counted micro-batch; a card counted
    on another number of IPUs: the whole replica's operations times each stage's share."""
    scale = config.micro_batch / card.compute_micro_batch
    if len(card.compute_ops) == config.ipus_per_replica:
        return [ops.price(config.chip, partials=card.partials, scale=scale)
                for ops in card.compute_ops]
    whole = _whole(card)
    by_share: dict[float, object] = {}
    for s in shares:  # equal shares: priced once
        if s not in by_share:
            by_share[s] = whole.price(config.chip, partials=card.partials, scale=scale * s)
    return [by_share[s] for s in shares]


def _whole(card: ModelCard):
    """The operations of all the IPUs of a replica in one profile."""
    return sum(card.compute_ops[1:], card.compute_ops[0])


def _norm_allreduce_stage_s(card: ModelCard, config: StepConfig, shares, cost, chip: Chip
                            ) -> list[float]:
    """Seconds of one micro-batch's distributed batch-norm all-reduces on each IPU of a
    replica (0 each without ``distributed_batch_norm_replica_group_size`` > 1 or batch
    norms in ``compute_ops``): every batch norm computing statistics (``OpRecord.dims ==
    (channels,)``) all-reduces :data:`BATCH_NORM_STAT_BYTES_PER_CHANNEL` bytes a channel
    among CONSECUTIVE groups of that many replicas (all groups at once: the cost model's
    ``cross_replica_sum`` on the stage's IPUs), plus one BSP sync
    (:data:`~collectives.performance.compute_model.SYNC_CYCLES`) each. A card counted on
    another number of IPUs: the whole replica's batch norms times each stage's share.

    Raises:
        ValueError: the replicas are not a multiple of the group size.
    """
    group = card.distributed_batch_norm_replica_group_size
    zero = [0.0] * len(shares)
    if group == 1 or not card.compute_ops:
        return zero
    if config.replicas % group:
        raise ValueError(f"a distributed batch norm over groups of {group} replicas needs the "
                         f"replicas ({config.replicas}) to be a multiple of {group}")
    groups = [tuple(range(r, r + group)) for r in range(0, config.replicas, group)]
    per_ipu = len(card.compute_ops) == config.ipus_per_replica
    profiles = card.compute_ops if per_ipu else (_whole(card),)
    seconds: dict[tuple[int, int], float] = {}
    out = []
    for j, ops in enumerate(profiles):
        total = 0.0
        for op, count in ops.ops:
            if op.kind != "normalisation" or not op.dims:
                continue
            nbytes = BATCH_NORM_STAT_BYTES_PER_CHANNEL * op.dims[0]
            key = (j, nbytes)
            if key not in seconds:
                seconds[key] = (cost.estimate_shares("cross_replica_sum", [0] * j + [nbytes],
                                                     groups=groups)
                                + SYNC_CYCLES / chip.clock_hz)
            total += count * seconds[key]
        out.append(total)
    return out if per_ipu else [out[0] * s for s in shares]


def _stream_bytes_per_s(chip: Chip) -> float:
    """Bytes/s an IPU reads a micro-batch's input at while the other IPUs of its machine read
    theirs: from the prefetch staging area in the machine's Streaming Memory ("prefetch ...
    into a staging area near the IPU ... in the Streaming Memory", Targeting the IPU from
    TensorFlow 1, "Efficient IPU I/O") over its PCIe link, the machine's Streaming Memory
    bandwidth shared by its IPUs (:attr:`ipu_node.chips.Chip.streaming_memory_bytes_per_s_per_ipu`);
    a machine without Streaming Memory (C2): the host link."""
    return chip.streaming_memory_bytes_per_s_per_ipu or chip.host_bytes_per_s_per_ipu


def _stream_copy_s(card: ModelCard, config: StepConfig, chip: Chip) -> float:
    """Seconds of one micro-batch's stream copy into the first IPU of a replica: its input
    bytes at :func:`_stream_bytes_per_s` plus one PCIe latency (ipupod assumption,
    :data:`ipu_node.hardware.links.PCIE_LATENCY_S`); 0 without input."""
    nbytes = card.input_bytes_per_item * config.micro_batch
    return PCIE_LATENCY_S + nbytes / _stream_bytes_per_s(chip) if nbytes else 0.0


def _host_io_s(card: ModelCard, config: StepConfig, chip: Chip) -> float:
    """Seconds to bring a step's input to the first stage's IPUs: per machine, the bytes of
    the replicas whose first IPU it holds over its host path (the busiest machine)."""
    per_replica = card.input_bytes_per_item * config.micro_batch * config.gradient_accumulation
    if not per_replica:
        return 0.0
    model = get_system_model(config.system)
    per_machine: dict[int, int] = {}
    for r in range(config.replicas):
        m = model.ipu(r * config.ipus_per_replica).machine
        per_machine[m] = per_machine.get(m, 0) + 1
    busiest = max(per_machine.values())
    bytes_per_s = min(chip.host_bytes_per_s_per_machine, busiest * chip.pcie_bytes_per_s)
    return busiest * per_replica / bytes_per_s


def what_if(card: ModelCard, config: StepConfig, efficiency: float | None = None,
            **changes) -> StepEstimate:
    """:func:`predict` of the same step on ``config`` with ``changes`` (``system``,
    ``replicas``, ``ipus_per_replica``, ``micro_batch``, ``gradient_accumulation``,
    ``instances``), without running anything.

    Raises:
        ValueError: an unknown change (names the known ones), or as :class:`StepConfig`.
    """
    unknown = sorted(set(changes) - set(_CHANGES))
    if unknown:
        raise ValueError(f"what_if: unknown change(s) {', '.join(unknown)}; known: "
                         f"{', '.join(_CHANGES)}")
    return predict(card, dataclasses.replace(config, **changes), efficiency)
