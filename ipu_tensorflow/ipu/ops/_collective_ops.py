"""TF-IPU's collective ops on TF tensors (reference tf-keras-ipu.md §6.5): each call is ONE
TF op (a ``numpy_function`` through :mod:`ipu_tensorflow._bridge`) that calls the matching
:mod:`collectives.ops` function, with GCL's semantics, errors and canonical tree order, for
the replica the op runs for. A nest of tensors (list, tuple, dict) moves as one fused call.
The gradient of ``cross_replica_sum`` is the ``cross_replica_sum`` of the incoming gradient
(TFI ``ipu/ops/cross_replica_ops_grad.py``).
"""

from __future__ import annotations

import math

import collectives.ops as _ops
import tensorflow as tf
from ipu_node import get_system

from ipu_tensorflow import _bridge

__all__ = ["cross_replica_sum", "cross_replica_mean", "all_gather", "reduce_scatter",
           "all_to_all", "replication_index", "assume_equal_across_replicas"]


def _nested(what: str, fn, x, shape_of=lambda s: s, dtype_of=lambda d: d):
    """``fn`` (numpy nest -> numpy nest) on the tensors of the nest ``x`` in one TF op."""
    leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)]

    def on_arrays(*arrays):
        out = fn(list(arrays) if len(arrays) > 1 or tf.nest.is_nested(x) else arrays[0])
        return list(out) if isinstance(out, list) else [out]
    results = _bridge.call(on_arrays, leaves, [dtype_of(t.dtype) for t in leaves],
                           [shape_of(t.shape) for t in leaves], what)
    return tf.nest.pack_sequence_as(x, results)


def _group_size(size):
    return size if size is not None else get_system().num_replicas


def cross_replica_sum(x, replica_group_size=None, name=None):
    """Sum of ``x`` (a tensor or nest) over each group of ``replica_group_size`` consecutive
    replicas (None: all); same shape and dtype."""
    @tf.custom_gradient
    def op(t):
        out = _nested("cross_replica_sum",
                      lambda a: _ops.cross_replica_sum(a, replica_group_size, name=name), t)

        def grad(dy):
            return cross_replica_sum(dy, replica_group_size, name=name and f"{name}/grad")
        return out, grad
    if tf.nest.is_nested(x):
        return _nested("cross_replica_sum",
                       lambda a: _ops.cross_replica_sum(a, replica_group_size, name=name), x)
    return op(tf.convert_to_tensor(x))


def cross_replica_mean(x, replica_group_size=None, name=None):
    """Mean of ``x`` over each group (GCL's MEAN: the tree sum divided by the group size)."""
    return _nested("cross_replica_mean",
                   lambda a: _ops.cross_replica_mean(a, replica_group_size, name=name), x)


def all_gather(x, replication_factor=None, name=None):
    """``[k, *x.shape]`` on every replica of the group: row p is member p's ``x``."""
    k = _group_size(replication_factor)
    return _nested("all_gather", lambda a: _ops.all_gather(a, replication_factor, name=name),
                   x, shape_of=lambda s: tf.TensorShape([k]).concatenate(s))


def reduce_scatter(x, replication_factor=None, op="COLLECTIVE_OP_ADD", name=None):
    """Rank-1 ``x`` of n elements reduced over the group; member p gets
    ``[ceil(n/k)]`` elements from ``p*ceil(n/k)``, zero-padded."""
    k = _group_size(replication_factor)

    def shape_of(s):
        return tf.TensorShape([math.ceil(s[0] / k) if s.rank == 1 and s[0] is not None
                               else None])
    return _nested("reduce_scatter",
                   lambda a: _ops.reduce_scatter(a, replication_factor, op, name=name), x,
                   shape_of=shape_of)


def all_to_all(x, split_dimension, concat_dimension, replication_factor=None, name=None):
    """XLA's AllToAll within each group (``collectives.ops.all_to_all``)."""
    k = _group_size(replication_factor)

    def shape_of(s):
        if s.rank is None:
            return s
        dims = s.as_list()
        if dims[split_dimension] is not None:
            dims[split_dimension] //= k
        if dims[concat_dimension] is not None:
            dims[concat_dimension] *= k
        return tf.TensorShape(dims)
    return _nested("all_to_all",
                   lambda a: _ops.all_to_all(a, split_dimension, concat_dimension,
                                             replication_factor, name=name), x,
                   shape_of=shape_of)


def replication_index(name=None):
    """The global index of the replica the op runs for, an int32 scalar (ipupod's choice
    where TF-IPU does not say: global under PopDist, as :func:`collectives.ops.replication_index`)."""
    index = _bridge.index_tensor("replication_index")
    return tf.identity(index + get_system().replica_index_offset, name=name)


def assume_equal_across_replicas(tensors, inplace=False):
    """An identity mark (no numerical effect)."""
    return tensors
