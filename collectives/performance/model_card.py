"""What a model is, for the step model (:mod:`collectives.performance.step_model`): the
:class:`ModelCard` (parameters, FLOPs per item, stage shares, input bytes), written by hand or
built from a run (:meth:`ModelCard.from_run`: the run's collective records, its pipeline's
report, its infeeds, or a PopTorch model's ``modelReport()``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ipu_node.execution.ipu_infeed_queue import dequeued_bytes

from collectives.performance.compute_model import PARTIALS_BYTES, ComputeProfile
from collectives.performance.cost_model import ALL_REDUCE_OPS

__all__ = ["ModelCard"]


def _positive(name: str, value, *, integer: bool) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        what = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {what} > 0, got {value!r}")


@dataclass(frozen=True)
class ModelCard:
    """What a model is, for the step model.

    Attributes:
        params: trainable parameters.
        flops_per_item: training FLOPs (forward + backward) of one item, e.g. ``3 * 8.18e9``
            for ResNet-50 at 224x224.
        grad_dtype: numpy dtype name of the gradients (and of the arithmetic priced from
            ``flops_per_item``; ``compute_ops`` are priced each at the dtype it was recorded
            in): ``'float16'`` or ``'float32'``.
        samples_per_item: samples per item (2 for a BERT pack of 2 sequences).
        input_bytes_per_item: bytes the host sends per item (150,528 for a 224x224x3 uint8
            image).
        stage_shares: the fraction of the FLOPs and parameters on each pipeline stage, one per
            IPU of a replica (normalised to sum 1); ``(1.0,)`` with several IPUs per replica
            means equal shares.
        optimizer_state_bytes_per_param: optimizer state per parameter, bytes (LAMB with fp32
            master weights and two moments: 12).
        optimizer_state_in: ``'sram'`` (In-Processor-Memory) or ``'streaming'`` (Streaming
            Memory: ``offload_weight_update_variables``).
        compute_ops: the operations of one micro-batch of ``compute_micro_batch`` items on each
            IPU of a replica (forward, backward and recomputation), as
            :class:`~collectives.performance.compute_model.ComputeProfile` objects or their plain
            form (:meth:`ComputeProfile.to_plain`); PopTorch's ``modelReport()`` gives them.
            With them the step model prices compute per operation
            (:mod:`collectives.performance.compute_model`); without, from ``flops_per_item``
            at a share of peak.
        compute_micro_batch: the items of the micro-batch ``compute_ops`` were counted at.
        partials: the AMP's partial-sum type ``compute_ops``' matmuls and convolutions are
            priced with: ``'float32'`` (PopART's default ``partialsTypeMatMuls``) or
            ``'float16'`` (PopTorch's ``Precision.setPartialsType(torch.half)``, TF-IPU's
            half partials).
        io_tiles: tiles set aside for I/O (PopTorch's ``opts.TensorLocations.numIOTiles``,
            PopART's ``numIOTiles``, TF-IPU's ``IPUConfig.io_tiles.num_io_tiles``). 0 (the
            default): an IPU computes nothing while its input streams in, so the step model
            charges each micro-batch's stream copy after its compute ("By default, while
            PopART is streaming data to and from an IPU, no other computation can occur on
            the IPU until the data transfer is complete", PopART User Guide, "Overlapping IO
            with compute"); more: the copies overlap compute.
        distributed_batch_norm_replica_group_size: replicas whose batch-norm statistics are
            all-reduced together, each time a batch norm runs in training (forward, its
            recomputation, backward: TF-IPU's
            ``norms.experimental.distributed_batch_norm_replica_group_size``, seeds
            004:1794-1796; Graphcore's MLPerf ResNet-50 ``BN_span: 2``, the result logs'
            ``model_bn_span`` 40 = 2 replicas x micro-batch 20). 1 (the default): each
            replica normalises its own micro-batch. Priced from the batch norms of
            ``compute_ops`` (their channels).

    Raises:
        ValueError: a count or size out of range, an unknown dtype or place.
    """

    params: int
    flops_per_item: float
    grad_dtype: str = "float16"
    samples_per_item: float = 1.0
    input_bytes_per_item: int = 0
    stage_shares: tuple[float, ...] = (1.0,)
    optimizer_state_bytes_per_param: float = 0
    optimizer_state_in: str = "sram"
    compute_ops: tuple = ()
    compute_micro_batch: int = 1
    partials: str = "float32"
    io_tiles: int = 0
    distributed_batch_norm_replica_group_size: int = 1

    def __post_init__(self):
        _positive("ModelCard.params", self.params, integer=True)
        _positive("ModelCard.flops_per_item", self.flops_per_item, integer=False)
        _positive("ModelCard.samples_per_item", self.samples_per_item, integer=False)
        if self.grad_dtype not in ("float16", "float32"):
            raise ValueError(f"ModelCard.grad_dtype must be 'float16' or 'float32', got "
                             f"{self.grad_dtype!r}")
        if self.input_bytes_per_item < 0 or self.optimizer_state_bytes_per_param < 0:
            raise ValueError("ModelCard.input_bytes_per_item and "
                             "optimizer_state_bytes_per_param must be >= 0, got "
                             f"{self.input_bytes_per_item!r} and "
                             f"{self.optimizer_state_bytes_per_param!r}")
        shares = tuple(self.stage_shares)
        if not shares or any(isinstance(s, bool) or not isinstance(s, (int, float)) or s < 0
                             for s in shares) or sum(shares) <= 0:
            raise ValueError(f"ModelCard.stage_shares must be numbers >= 0 with a positive "
                             f"sum, got {self.stage_shares!r}")
        _positive("ModelCard.compute_micro_batch", self.compute_micro_batch, integer=True)
        object.__setattr__(self, "compute_ops",
                           tuple(ComputeProfile.from_plain(p) for p in self.compute_ops))
        if self.partials not in PARTIALS_BYTES:
            raise ValueError(f"ModelCard.partials must be one of {tuple(PARTIALS_BYTES)}, got "
                             f"{self.partials!r}")
        if isinstance(self.io_tiles, bool) or not isinstance(self.io_tiles, int) \
                or self.io_tiles < 0:
            raise ValueError(f"ModelCard.io_tiles must be an integer >= 0, got "
                             f"{self.io_tiles!r}")
        _positive("ModelCard.distributed_batch_norm_replica_group_size",
                  self.distributed_batch_norm_replica_group_size, integer=True)
        if self.optimizer_state_in not in ("sram", "streaming"):
            raise ValueError(f"ModelCard.optimizer_state_in must be 'sram' or 'streaming', "
                             f"got {self.optimizer_state_in!r}")

    @property
    def grad_bytes(self) -> int:
        """Gradient bytes of one replica: ``params * itemsize(grad_dtype)``."""
        return self.params * np.dtype(self.grad_dtype).itemsize

    def shares_for(self, ipus_per_replica: int) -> tuple[float, ...]:
        """The stage shares for ``ipus_per_replica`` IPUs, normalised to sum 1.

        Raises:
            ValueError: ``stage_shares`` has neither 1 nor ``ipus_per_replica`` entries.
        """
        shares = tuple(self.stage_shares)
        if len(shares) == 1:
            shares = (1.0,) * ipus_per_replica
        if len(shares) != ipus_per_replica:
            raise ValueError(f"ModelCard.stage_shares has {len(shares)} stages but the "
                             f"replica has {ipus_per_replica} IPUs")
        total = float(sum(shares))
        return tuple(s / total for s in shares)

    @classmethod
    def from_run(cls, records: Sequence = (), *, pipeline=None, micro_batch: int = 1,
                 flops_per_item: float | None = None, steps: int = 1, infeed=None,
                 run=None, **fields) -> "ModelCard":
        """A card from a run, without re-running it.

        * ``run``: a front end's own account of its model in plain types, a mapping of card
          fields (``params``, ``flops_per_item``, ``stage_shares``, ``grad_dtype``,
          ``input_bytes_per_item``, ``optimizer_state_bytes_per_param``,
          ``optimizer_state_in``, ``compute_ops``, ``compute_micro_batch``, ``partials``,
          ``io_tiles``)
          or an object with a ``card_fields()`` method giving one
          (PopTorch: ``model.modelReport()``, FLOPs counted from the PyTorch operations); the
          fields given as keywords win. With ``run`` nothing below is needed.

        * ``params`` and ``grad_dtype`` from the run's collectives ledger (``records``: its
          :class:`~collectives.records.CallRecord` list, :func:`collectives.call_records`
          of this instance): the bytes of every ``cross_replica_*`` call over ``steps``
          steps, divided by ``steps`` (or ``params=`` given);
        * ``flops_per_item`` as given, or from ``pipeline``, the run's
          :class:`ipu_node.pipelining_ops.PipelineReport` (``last_report()``): the modelled
          compute seconds of its forward and backward passes (from the FLOPs its
          ``Stage(flops=...)`` declared) times the peak of the configured system's chip in
          ``grad_dtype`` and the clock's ``compute_efficiency``, over the items of its
          ``gradient_accumulation_count * repeat_count`` micro-batches of ``micro_batch``
          items; ``stage_shares`` from each stage's share of that compute;
        * ``input_bytes_per_item`` as given, or from the run's infeeds: ``infeed``, the
          :func:`ipu_node.ipu_infeed_queue.dequeued_bytes` of the run (default: this
          process's, read now): per replica, the bytes of every queue's dequeued elements
          over its iterations (the most dequeues of one queue), averaged over the replicas,
          over ``micro_batch`` items per element (a TF-IPU dataset batched to the
          micro-batch, one element per micro-batch); 0 when no queue was dequeued;
        * other fields as given (optimizer state, ...).

        Raises:
            ValueError: neither all-reduces in ``records`` nor ``params``; neither
                ``flops_per_item`` nor ``pipeline``; ``steps`` or ``micro_batch`` < 1;
                ``run`` gives a field a card does not have, or values a card refuses.
        """
        _positive("steps", steps, integer=True)
        _positive("micro_batch", micro_batch, integer=True)
        if run is not None:
            given = run.card_fields() if hasattr(run, "card_fields") else dict(run)
            unknown = set(given) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise ValueError(f"ModelCard.from_run: run gives unknown field(s) "
                                 f"{sorted(unknown)}")
            merged = {**given, **fields}
            if flops_per_item is not None:
                merged["flops_per_item"] = flops_per_item
            for name in ("stage_shares", "compute_ops"):
                if name in merged:
                    merged[name] = tuple(merged[name])
            return cls(**merged)
        reduces = [r for r in records if r.op in ALL_REDUCE_OPS]
        if reduces and "params" not in fields:
            nbytes = sum(r.nbytes for r in reduces) / steps
            dtype = max((r.dtype for r in reduces), key=lambda d: np.dtype(d).itemsize)
            dtype = fields.setdefault(
                "grad_dtype", dtype if dtype in ("float16", "float32") else "float32")
            fields["params"] = max(1, round(nbytes / np.dtype(dtype).itemsize))
        if "params" not in fields:
            raise ValueError("the run's ledger holds no cross_replica_* call: no gradients "
                             "to size the card from (give params=)")
        if flops_per_item is None:
            if pipeline is None:
                raise ValueError("ModelCard.from_run needs flops_per_item or the run's "
                                 "pipeline report (pipelining_ops.last_report())")
            flops_per_item, shares = _flops_of_pipeline(
                pipeline, micro_batch, fields.get("grad_dtype", "float16"))
            fields.setdefault("stage_shares", shares)
        if "input_bytes_per_item" not in fields:
            fields["input_bytes_per_item"] = _input_bytes_per_item(infeed, micro_batch)
        return cls(flops_per_item=flops_per_item, **fields)


def _input_bytes_per_item(infeed, micro_batch: int) -> float:
    """Bytes per item fed by the run's infeeds (``ModelCard.from_run``)."""
    if infeed is None:
        infeed = dequeued_bytes()
    fed: dict[int, float] = {}
    iterations: dict[int, int] = {}
    for nbytes, counts in infeed.values():
        for replica, n in counts.items():
            fed[replica] = fed.get(replica, 0) + nbytes * n
            iterations[replica] = max(iterations.get(replica, 0), n)
    if not fed:
        return 0
    per_element = sum(fed[r] / iterations[r] for r in fed) / len(fed)
    per_item = per_element / micro_batch
    return int(per_item) if float(per_item).is_integer() else per_item


def _flops_of_pipeline(report, micro_batch: int, dtype: str) -> tuple[float, tuple]:
    """(FLOPs per item, stage shares) of a pipeline report's forward and backward passes."""
    from ipu_node import clock

    per_stage: dict[int, float] = {}
    for r in report.steps:
        if r.kind in ("F", "B"):
            per_stage[r.stage] = per_stage.get(r.stage, 0.0) + r.compute_s
    total_s = sum(per_stage.values())
    if not total_s:
        raise ValueError("the pipeline report has no modelled compute: declare FLOPs with "
                         "Stage(flops=...)")
    items = (micro_batch * report.gradient_accumulation_count
             * max(report.repeat_count, 1))
    flops = total_s * clock.peak_flops("ipu2", dtype) * clock.compute_efficiency() / items
    shares = tuple(per_stage[s] / total_s for s in sorted(per_stage))
    return flops, shares
