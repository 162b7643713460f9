"""``tensorflow.python.ipu.horovod`` as the seeds give it (seed 004:2069-2104): TF-IPU's
pared-down Horovod, with TF-IPU's signatures, over :mod:`collectives.framework.horovod`.

    from collectives.ipu import horovod as hvd      # TF-IPU: from tensorflow.python.ipu
    hvd.init()                                      #         import horovod as hvd
    hvd.allreduce(grads, op=hvd.Sum)

The path mirrors TF-IPU's ``ipu.horovod`` (``collectives.framework.horovod`` already is
horovod.torch's API, whose ``allreduce`` takes ``average``, ``name``, ``compression``...
first: a TF-IPU program's positional ``allreduce(tensor, op)`` would land on ``average``
there). The strategies live where TF-IPU keeps them:
:mod:`collectives.ipu.horovod.ipu_horovod_strategy`,
:mod:`~collectives.ipu.horovod.ipu_multi_replica_strategy`,
:mod:`~collectives.ipu.horovod.popdist_strategy`.

Tensors are numpy arrays, ipupod ``Variable``\\ s, or anything ``np.asarray`` takes (torch
tensors too); results are new numpy arrays (torch tensors for torch inputs).
"""

from __future__ import annotations

from collectives.framework import horovod as _hvd
from collectives.framework.horovod import (Adasum, Average, Sum, ccl_built, ddl_built, gloo_built,
                                 gloo_enabled, init, is_homogeneous, local_rank, local_size,
                                 mpi_built, mpi_enabled, mpi_threads_supported, nccl_built,
                                 rank, shutdown, size)

#: TF-IPU's name of the oneCCL query (horovod's older ``mlsl_built``)
mlsl_built = ccl_built


def allreduce(tensor, op=None):
    """Reduce ``tensor`` over all Horovod processes (seed 004:2081-2094).

    Args:
        tensor: an array-like (``tf.Tensor``/``tf.Variable`` in TF-IPU), the same shape on
            every rank.
        op: ``Sum``, ``Average`` or None: Average, as the seed's parameter text says (its
            Returns text says "summed": the seeds' known inconsistency, decided for the
            parameter text and Horovod's own default).

    Returns:
        A new tensor of the same shape and dtype (0-d stays 0-d).

    Raises:
        NotImplementedError: ``op=Adasum`` (TF-IPU's "The Adasum reduction is not
            implemented.").
        ValueError, CollectiveMismatchError: as :func:`collectives.framework.horovod.allreduce`.
    """
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction is not implemented.")
    return _hvd.allreduce(tensor, op=Average if op is None else op)


def allgather(tensor, name=None):
    """Concatenate ``tensor`` over all Horovod processes on dimension 0 (seed 004:2071-2079):
    the first dimension may differ between processes, the others not.

    Returns:
        A new tensor ``[sum of the first dimensions, *rest]``.
    """
    return _hvd.allgather(tensor, name=name)


def broadcast(tensor, root_rank, name=None):
    """``tensor`` of process ``root_rank`` on every process (seed 004:2096-2104); shape and
    dtype the same everywhere.

    Returns:
        A new tensor with the root's values.
    """
    return _hvd.broadcast(tensor, root_rank, name=name)


__all__ = ["init", "shutdown", "size", "local_size", "rank", "local_rank", "Average", "Sum",
           "Adasum", "allreduce", "allgather", "broadcast", "mpi_threads_supported",
           "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built",
           "ddl_built", "mlsl_built", "is_homogeneous"]
