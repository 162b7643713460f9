"""Horovod's API: ``import collectives.framework.horovod as hvd``.

horovod.torch's names, signatures (positional order included) and semantics, on numpy
arrays and on torch tensors alike: a torch tensor gives a torch tensor of the same dtype,
shape and device (:mod:`collectives.framework.horovod._tensors`; torch is never imported by this
package, only used when the program passes its tensors). The TF-IPU subset of the seeds
(004:2069-2104), with TF-IPU's signatures, is :mod:`collectives.ipu.horovod`. One Horovod
process per ipupod instance; collectives go over the configured IPU system's transport
(MPI, gRPC or local), so programs run under plain ``mpirun -n N python prog.py``,
``poprun -n N`` and ``python -m launch.multiworker``.

Where ipupod differs from Horovod, on purpose:

* Ranks that disagree (shape, ndim, dtype, op, scale factors, root, name, number of
  tensors, kind of collective) raise ``CollectiveMismatchError`` on every rank of the
  process set instead of waiting for ever, and an argument error of one rank (Horovod's
  messages: non-integer ``alltoall`` splits, a 0-d ``reducescatter``, a bad root...) is
  raised on every rank; the next call works. A rank calling on a process set it is not in
  raises ValueError at once (as Horovod); ranks calling on different process sets wait
  for each other and time out (``CollectiveTimeoutError`` naming the missing ranks) after
  ``IPUPOD_COLLECTIVE_TIMEOUT_S``. Horovod's calls agree through the collectives' one
  agreement (:mod:`collectives.framework.horovod._request`), as the replicas' calls do: a
  Horovod call where another instance calls a collective of the replicas raises
  ``CollectiveMismatchError`` on both, naming both calls, and one that meets another
  instance's end of program raises ``PeerLostError`` naming that instance.
* ``broadcast_object``/``allgather_object`` encode objects as JSON with numpy arrays and
  torch tensors, not cloudpickle (see :mod:`collectives.framework.horovod._objects` for the types
  allowed).
* Calls are synchronous: the ``*_async`` functions do the call and return a handle whose
  ``synchronize`` gives the result. ``DistributedOptimizer`` reduces the gradients in
  ``step()``/``synchronize()`` (:mod:`collectives.framework.horovod._optimizer`).
"""

from __future__ import annotations

from collectives.framework.horovod._call import Adasum, Average, Max, Min, Product, Sum
from collectives.framework.horovod._compression import Compression
from collectives.framework.horovod._exchange import alltoall, grouped_reducescatter, reducescatter
from collectives.framework.horovod._move import (allgather, broadcast, broadcast_,
                                       broadcast_parameters, grouped_allgather)
from collectives.framework.horovod._object_ops import allgather_object, broadcast_object
from collectives.framework.horovod._ops import barrier, join
from collectives.framework.horovod._optimizer import DistributedOptimizer, broadcast_optimizer_state
from collectives.framework.horovod._reduce import (allreduce, allreduce_, grouped_allreduce,
                                         grouped_allreduce_)
from collectives.framework.horovod._state import (HorovodNotInitializedError, ProcessSet,
                                        add_process_set, cross_rank, cross_size,
                                        global_process_set, init, is_homogeneous,
                                        is_initialized, local_rank, local_size,
                                        mpi_enabled, rank, remove_process_set, shutdown, size)
from collectives.framework.horovod._async import (allgather_async, allreduce_async, allreduce_async_,
                                        alltoall_async, broadcast_async, broadcast_async_,
                                        grouped_allgather_async, grouped_allreduce_async,
                                        grouped_allreduce_async_, grouped_reducescatter_async,
                                        poll, reducescatter_async, synchronize)


def rank_in_set(process_set: ProcessSet) -> int:
    """This rank's position in ``process_set`` (its ``rank()``)."""
    return process_set.rank()


# -- what this Horovod was built with (horovod.torch's build queries) ---------------------

def mpi_built() -> bool:
    """True: the MPI transport (mpi4py and the MPICH wheel) is part of ipupod."""
    return True


def mpi_threads_supported() -> bool:
    """Whether the MPI transport is in use (it runs from one thread at a time, the engine's
    leader, as Horovod's background thread)."""
    return mpi_enabled()


def gloo_built() -> bool:
    """False: no Gloo here (the gRPC transport plays its part)."""
    return False


def gloo_enabled() -> bool:
    """False: see :func:`gloo_built`."""
    return False


def nccl_built() -> bool:
    """False: no GPUs."""
    return False


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def cuda_built() -> bool:
    """False: CPU only."""
    return False


def rocm_built() -> bool:
    """False: CPU only."""
    return False


__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "Sum", "Average", "Min", "Max", "Product",
    "Adasum", "Compression", "allreduce", "allreduce_", "grouped_allreduce",
    "grouped_allreduce_", "allgather", "grouped_allgather", "broadcast", "broadcast_",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object", "alltoall", "reducescatter", "grouped_reducescatter", "join",
    "barrier", "DistributedOptimizer", "ProcessSet", "global_process_set", "add_process_set",
    "remove_process_set", "HorovodNotInitializedError", "allreduce_async", "allreduce_async_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather_async",
    "grouped_allgather_async", "broadcast_async", "broadcast_async_", "alltoall_async",
    "reducescatter_async", "grouped_reducescatter_async", "poll", "synchronize",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "gloo_built", "gloo_enabled",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built",
]
