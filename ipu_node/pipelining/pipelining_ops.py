"""``ipu_node.pipelining_ops``: TF-IPU's pipelining API over the user's numpy stages.

A model cut into stages runs over the IPUs of one replica (reference execution-model.md):

    stages = [Stage(s1_fwd, s1_bwd, flops=2 * b * 784 * 256), Stage(s2_fwd, s2_bwd)]
    pipeline(stages, gradient_accumulation_count=8, infeed_queue=infeed,
             outfeed_queue=outfeed, optimizer_function=opt_fn, device_mapping=[0, 1])
    report = last_report()   # modelled steps, total_s, bubble_fraction, stash_depth, busy_s

A stage is a :class:`Stage`: ``forward(*inputs) -> (outputs, saved)`` and
``backward(saved, output_grads) -> ({Variable: grad}, input_grads)``; a plain callable is an
inference stage (``fn(*inputs) -> outputs``). Stage ``i``'s outputs are stage ``i+1``'s
inputs (a tuple or list goes in positionally, a dict of str keys as keyword arguments,
anything else as one argument). Stage 0 receives ``inputs`` followed by the dequeued infeed
element ([004:4009-4013]).

Everything is eager: :func:`pipeline` runs the passes now, in the exact order of the
schedule's closed forms (:mod:`ipu_node.pipelining.schedules`), in the calling
replica's thread, and returns None. Gradients of each Variable are summed over the micro-batches in ascending
order from zeros (bit-reproducible; every schedule gives the same numbers), and the optimizer
of ``optimizer_function`` applies them once per ``gradient_accumulation_count`` micro-batches
(once per repeat). Modelled time comes from the stages' FLOPs, the links and the collectives,
never from wall time (:mod:`ipu_node.clock`).

ipupod rules where TF-IPU differs or is silent (each written where it applies):

* The loss must be one of the last stage's outputs; ``optimizer_function`` receives the last
  stage's outputs once per micro-batch and returns an :class:`OptimizerFunctionOutput`
  whose ``loss`` is one of them (by identity); the optimizer of the first micro-batch of a
  repeat applies the update. A stateful optimizer (momentum) must be made once, outside.
* ``device_mapping[i]`` is a shard index of the replica (``0 .. ipus_per_replica-1``).
* The offload, sharding-of-state and ``*_poplar_options`` arguments are validated and
  recorded in the report only; they change no numbers.
"""

from __future__ import annotations

import inspect
import threading
from typing import Callable, Sequence

from ipu_node.pipelining._pipeline_check import check_pipeline
from ipu_node.pipelining._pipeline_report import PipelineReport, StepRecord
from ipu_node.pipelining._pipeline_run import run_pipeline
from ipu_node.pipelining.schedules import PipelineSchedule
from ipu_node.pipelining._pipeline_types import (GradientAccumulationReductionMethod,
                                                 OptimizerFunctionOutput, PipelineStageOptions,
                                                 RecomputationMode, Stage)

__all__ = ["pipeline", "Stage", "PipelineSchedule", "RecomputationMode",
           "PipelineStageOptions", "OptimizerFunctionOutput", "recomputation_checkpoint",
           "last_report", "PipelineReport", "StepRecord", "GradientAccumulationReductionMethod",
           "check_arguments"]

def recomputation_checkpoint(tensors, name: str | None = None):
    """Returns ``tensors`` unchanged (TF-IPU marks a recomputation checkpoint; ipupod
    recomputes whole stages, so the mark changes nothing)."""
    return tensors


_last_lock = threading.Lock()
_last_by_replica: dict[int, PipelineReport] = {}
_last_owner: list = [None]  # the IPUSystem the reports belong to


def last_report() -> PipelineReport | None:
    """The report of the last :func:`pipeline` run of the configured system: inside a
    replica function, that replica's last run; outside, local replica 0's (the lowest local
    index that ran one). None before any run."""
    from ipu_node.runtime.replica import current_replica_context
    from ipu_node.runtime.system import _system

    ctx = current_replica_context()
    with _last_lock:
        if _last_owner[0] is not _system or not _last_by_replica:
            return None
        if ctx is not None:
            return _last_by_replica.get(ctx.local_index)
        return _last_by_replica[min(_last_by_replica)]


def _store_report(report: PipelineReport, local_index: int) -> None:
    from ipu_node.runtime.system import _system

    with _last_lock:
        if _last_owner[0] is not _system:
            _last_by_replica.clear()
            _last_owner[0] = _system
        _last_by_replica[local_index] = report


def pipeline(computational_stages: Sequence, gradient_accumulation_count: int | None = None,
             gradient_accumulation_dtype=None, repeat_count: int = 1,
             batch_serialization_iterations: int = 1, inputs: Sequence | None = None,
             infeed_queue=None, outfeed_queue=None,
             optimizer_function: Callable | None = None,
             device_mapping: Sequence[int] | None = None,
             pipeline_schedule: PipelineSchedule | None = None,
             recomputation_mode: RecomputationMode | None = None,
             forward_propagation_stages_poplar_options=None,
             backward_propagation_stages_poplar_options=None,
             weight_update_poplar_options=None, offload_weight_update_variables=None,
             replicated_optimizer_state_sharding: bool = False, offload_activations=None,
             offload_gradient_accumulation_buffers=None, replicated_weight_sharding=None,
             offload_weights=None, continuous_weight_updates: bool = False,
             outfeed_loss: bool = False, accumulate_outfeed: bool = False,
             accumulate_outfeed_dtype=None, outfeed_mask: Sequence[bool] | None = None,
             name: str | None = None, reduction_method="SUM") -> None:
    """Run ``repeat_count`` pipeline executions of ``gradient_accumulation_count`` (G)
    micro-batches each over this replica's IPUs (the parameters of seed 004:4007, same
    defaults, plus HEAD's ``reduction_method``).

    Must be called inside a replica function (``strategy.run``, ``ipu_compiler.compile``).
    Each repeat dequeues G infeed elements (replica r of R gets elements ``i*R + r``),
    runs the schedule, applies the optimizer once (training) and enqueues per reference
    §1.5: in inference the last stage's outputs per micro-batch (an array as an array, a
    dict as a dict, a tuple/list as a list); in training the outputs ``outfeed_mask``
    leaves (True drops) as a list, or the loss itself with ``outfeed_loss``; with
    ``accumulate_outfeed`` their sum over the G micro-batches once per repeat.

    Raises:
        ValueError, TypeError, NotImplementedError: the rules of reference §1.3/§1.9 with
            TF-IPU's messages (G missing or negative, fewer than two stages, device_mapping
            type/length/range, schedule or mode not an enum member, outfeed options, ...).
        FailedPreconditionError: G is not a multiple of the schedule's overlap length L, or
            G < L (reference §1.3).
        NotInReplicaError: outside a replica function.
    """
    plan = check_pipeline(locals())
    report = run_pipeline(plan)
    _store_report(report, plan.local_index)


def check_arguments(computational_stages: Sequence, **kwargs) -> None:
    """Check :func:`pipeline`'s arguments as it does, without running anything: a front end
    that builds its pipeline before running it (TF's op) raises TF-IPU's errors when it is
    built, and widens the replicas (:class:`~ipu_node.errors.WiderReplicasNeeded`) before
    anything ran.

    Raises:
        The errors of :func:`pipeline`'s checks.
    """
    bound = inspect.signature(pipeline).bind(computational_stages, **kwargs)
    bound.apply_defaults()
    check_pipeline(dict(bound.arguments))
