"""``horovod.torch`` beside ``poptorch``: Horovod's PyTorch API over
:mod:`collectives.horovod`, served as ``import horovod.torch as hvd`` when the real Horovod
is not installed (reference poptorch.md §8; Graphcore's CNN and BERT applications import it
beside poptorch under poprun).

Every name of :mod:`collectives.horovod` (``init``, ``rank``, ``size``,
``broadcast_parameters``, ``broadcast_optimizer_state``, ``allreduce(tensor, average=None,
name=None, op=None)``, ``allgather``, ``allgather_object``, ``grouped_allreduce``,
``DistributedOptimizer``, the ops ``Sum``/``Average``/``Adasum``/``Min``/``Max``/``Product``,
...) is this module's, the same objects: a torch tensor in gives a torch tensor out, of the
same dtype and shape. One Horovod process is one ipupod instance: under ``poprun -n N`` its
rank is the instance index and its collectives go over the job's transport, the one the
instance's ``trainingModel`` reduces its gradients over (``hvd.init()`` before the model
configures the IPU system poprun placed the instance on; the model then attaches to it).

Added here, as horovod.torch has them: ``start_timeline``/``stop_timeline`` (accepted,
recorded in the report's ``sections.poptorch.calls``, no effect: ipupod's timeline is the run report's Chrome trace).
"""

from __future__ import annotations

from collectives.horovod import (Adasum, add_process_set, allgather, allgather_async,
                                 allgather_object, allreduce, allreduce_, allreduce_async,
                                 allreduce_async_, alltoall, alltoall_async, Average, barrier,
                                 broadcast, broadcast_, broadcast_async, broadcast_async_,
                                 broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                                 ccl_built, Compression, cross_rank, cross_size, cuda_built,
                                 ddl_built, DistributedOptimizer, global_process_set, gloo_built,
                                 gloo_enabled, grouped_allgather, grouped_allgather_async,
                                 grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                                 grouped_allreduce_async_, grouped_reducescatter,
                                 grouped_reducescatter_async, HorovodNotInitializedError, init,
                                 is_homogeneous, is_initialized, join, local_rank, local_size, Max,
                                 Min, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                 poll, ProcessSet, Product, rank, reducescatter,
                                 reducescatter_async, remove_process_set, rocm_built, shutdown,
                                 size, Sum, synchronize)  # noqa: F401

from poptorch._logging import logger
from poptorch.modelling._report import record_call

__all__ = [
    "Adasum", "add_process_set", "allgather", "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall",
    "alltoall_async", "Average", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "ccl_built", "Compression", "cross_rank", "cross_size",
    "cuda_built", "ddl_built", "DistributedOptimizer", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "HorovodNotInitializedError",
    "init", "is_homogeneous", "is_initialized", "join", "local_rank", "local_size", "Max",
    "Min", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll",
    "ProcessSet", "Product", "rank", "reducescatter", "reducescatter_async",
    "remove_process_set", "rocm_built", "shutdown", "size", "Sum", "synchronize",
    "start_timeline", "stop_timeline"]

def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's timeline of collective activity to ``file_path``. ipupod: recorded, no
    effect (the run report's Chrome trace, ``ipupod-report``, shows the collectives)."""
    record_call("hvd.start_timeline", file_path=str(file_path), mark_cycles=bool(mark_cycles))
    logger.info("hvd.start_timeline(%s): recorded, no effect (see the run report's trace)",
                file_path)


def stop_timeline() -> None:
    """Stop Horovod's timeline. ipupod: recorded, no effect."""
    record_call("hvd.stop_timeline")
