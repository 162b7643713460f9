"""``horovod.tensorflow`` (and the collectives of TF-IPU's ``ipu.horovod``) on TF tensors,
over :mod:`collectives.horovod` (the same Horovod state, process sets and wire as
``horovod.torch`` on ipupod). Served as ``horovod.tensorflow`` by :mod:`ipupod_aliases` when
no real Horovod is installed.

The process-level names (``init``, ``size``, ``rank``, ``local_rank``, the op constants,
the build probes, ...) are :mod:`collectives.horovod`'s own objects. ``allreduce``,
``allgather``, ``broadcast``, ``alltoall`` and ``reducescatter`` take and return TF tensors:
in eager code they call :mod:`collectives.horovod` on the tensor's numpy value; inside a
``tf.function`` they are one ``numpy_function`` op each, in program order
(:func:`ipu_tensorflow._bridge.ordered_numpy_function`). ``allreduce(op=None)`` averages
(Horovod's default, and TF-IPU's code, reference tf-keras-ipu.md §9 #5).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from collectives import horovod as _hvd
from collectives.horovod import (Adasum, Average, Max, Min, Product, Sum, ddl_built,  # noqa: F401
                                 gloo_built, gloo_enabled, init, is_initialized, local_rank,
                                 local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                                 nccl_built, rank, shutdown, size)

from ipu_tensorflow import _bridge

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
           "Sum", "Average", "Min", "Max", "Product", "Adasum", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built",
           "allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
           "broadcast_variables"]


def _host_op(fn, tensor, name: str, shape=None):
    """``fn(numpy value)`` on ``tensor``: directly in eager code, one op in a graph."""
    tensor = tf.convert_to_tensor(tensor)
    if tf.executing_eagerly():
        return tf.convert_to_tensor(np.asarray(fn(tensor.numpy())), dtype=tensor.dtype)
    out = _bridge.ordered_numpy_function(lambda a: np.asarray(fn(a), dtype=a.dtype),
                                         [tensor], tensor.dtype, name=name)
    out.set_shape(tensor.shape if shape is None else shape)
    return out


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None,
              op=None, prescale_factor=1.0, postscale_factor=1.0, name=None):
    """``tensor`` reduced over the ranks (``op=None``: Average; Adasum raises
    NotImplementedError as TF-IPU's)."""
    if op is Adasum:
        raise NotImplementedError("The Adasum reduction is not implemented.")
    return _host_op(lambda a: _hvd.allreduce(a, average=average, name=name, op=op,
                                             prescale_factor=prescale_factor,
                                             postscale_factor=postscale_factor),
                    tensor, "HorovodAllreduce")


def allgather(tensor, name=None):
    """``tensor`` of every rank, concatenated on dimension 0 in rank order (first dimensions
    may differ)."""
    shape = tf.TensorShape([None]).concatenate(tf.convert_to_tensor(tensor).shape[1:])
    return _host_op(lambda a: _hvd.allgather(a, name=name), tensor, "HorovodAllgather", shape)


def broadcast(tensor, root_rank, name=None):
    """Rank ``root_rank``'s ``tensor`` on every rank."""
    return _host_op(lambda a: _hvd.broadcast(a, root_rank, name=name), tensor,
                    "HorovodBroadcast")


def alltoall(tensor, splits=None, name=None):
    """Horovod's alltoall (equal splits of dimension 0 when ``splits`` is None)."""
    return _host_op(lambda a: _hvd.alltoall(a, splits, name=name), tensor, "HorovodAlltoall",
                    tf.TensorShape(None))


def reducescatter(tensor, op=Average, name=None):
    """Horovod's reducescatter over dimension 0."""
    return _host_op(lambda a: _hvd.reducescatter(a, name=name, op=op), tensor,
                    "HorovodReducescatter", tf.TensorShape(None))


def broadcast_variables(variables, root_rank):
    """Assign rank ``root_rank``'s value to each of ``variables``."""
    for variable in variables:
        variable.assign(broadcast(variable, root_rank))
