"""Horovod's allreduce family (horovod.torch's names, positional order and semantics), on
numpy arrays and torch tensors (:mod:`collectives.framework.horovod._tensors`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collectives._engine.fusion import grouped_per_dtype
from collectives.framework.horovod import _autograd, _data
from collectives.framework.horovod._call import (Adasum, Average, Call, factor, op_of,
                                       reduction_dtypes, supported)
from collectives.framework.horovod._compression import Compression
from collectives.framework.horovod._state import ProcessSet, global_process_set
from collectives.framework.horovod._tensors import (from_array, is_torch, reduction_check, to_array,
                                          write_into)
from collectives.framework.horovod._request import Signature


def signature(arrays, op, pre, post, ps, name, grouped) -> Signature:
    """What ranks compare before an allreduce."""
    return Signature("allreduce", {"op": op, "prescale_factor": pre, "postscale_factor": post,
                                   "process_set": ps.process_set_id, "name": name,
                                   "grouped": grouped},
                     [(a.dtype.name, a.shape) for a in arrays])


def run(call: Call, sig: Signature, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The data of an agreed allreduce (zeros from a joined rank): new arrays."""
    op = sig.fields["op"]
    pre, post = sig.fields["prescale_factor"], sig.fields["postscale_factor"]
    if op == Average:
        post = post / call.size  # Horovod: averaging happens via the postscale factor
    arrays = [_data.scale(a, pre) for a in arrays]
    if op == Adasum:
        reduced = _data.adasum_tensors(call.engine, call.comm, call.members, arrays)
        return [_data.scale(r, post) for r in reduced]
    return grouped_per_dtype(arrays, lambda group, dtype: _data.allreduce_group(
        call.engine, call.comm, call.members, group, op, post))  # Horovod's fusion


def _prepared(call: Call, tensors, average, op, compression, pre, post):
    """``(op, arrays, likes, contexts, pre, post)`` of a call's arguments (in
    :meth:`Call.checking`)."""
    op = op_of(op, average, call.what)
    compressed = [(t, None) for t in tensors] if compression is Compression.none else \
        [compression.compress(t) for t in tensors]
    arrays, likes = zip(*[to_array(c) for c, _ in compressed]) if compressed else ((), ())
    for like in likes:
        reduction_check(like, call.what)
    arrays = [supported(a, call.what) for a in arrays]
    reduction_dtypes(arrays, op, call.what)
    return (op, arrays, list(likes), [ctx for _, ctx in compressed],
            factor(pre, call.what, "prescale_factor"),
            factor(post, call.what, "postscale_factor"))


def _grouped(tensors: Sequence, average, name, compression, op, prescale_factor,
             postscale_factor, process_set: ProcessSet, what: str, grouped: bool,
             into: Sequence | None = None) -> list:
    """The allreduce of ``tensors``; with ``into``, written into those tensors (in place)."""
    call = Call(process_set, what)
    with call.checking():
        if not isinstance(tensors, (list, tuple)):
            raise TypeError(f"hvd.{what}: tensors must be a list or tuple, not "
                            f"{type(tensors).__name__}")
        for target in into or ():
            writable(target, what)
        agreed_op, arrays, likes, ctxs, pre, post = _prepared(
            call, tensors, average, op, compression, prescale_factor, postscale_factor)
    sig = signature(arrays, agreed_op, pre, post, process_set, name, grouped)

    def forward(*_inputs) -> list:
        with call.lock:
            call.agree(sig)
            results = run(call, sig, arrays)
        if into is not None:
            for target, r in zip(into, results):
                write_into(target, r)
            return list(into)
        if compression is Compression.none:
            return [from_array(r, like) for r, like in zip(results, likes)]
        return [compression.decompress(from_array(r, like), ctx)
                for r, like, ctx in zip(results, likes, ctxs)]

    if into is not None or not any(like.is_torch for like in likes) or \
            not _autograd.wants_graph(tensors):
        return forward()

    def backward(*grads):  # horovod.torch's: the gradient allreduced alike
        if grouped:
            return tuple(grouped_allreduce(list(grads), average, None, Compression.none, op,
                                           prescale_factor, postscale_factor, process_set))
        return (allreduce(grads[0], average, None, Compression.none, op, prescale_factor,
                          postscale_factor, process_set),)

    return _autograd.apply(forward, backward, list(tensors))


def writable(target, what: str) -> None:
    """Check the target of an in-place op.

    Raises:
        TypeError: neither a writeable numpy array nor a torch tensor.
    """
    if is_torch(target):
        return
    if not isinstance(target, np.ndarray) or not target.flags.writeable:
        raise TypeError(f"hvd.{what}: in-place ops need a writeable numpy array or a torch "
                        f"tensor, got {type(target).__name__}")


def grouped_allreduce(tensors: Sequence, average=None, name: str | None = None,
                      compression=Compression.none, op=None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list:
    """Allreduce a list of tensors as one fused operation (per dtype one buffer).

    Args:
        tensors: numpy array-likes or torch tensors (float16/32/64, int32/64); shapes may
            differ from each other but each must be the same on every rank of the set.
        average: deprecated (Horovod's): True is ``op=Average``, False ``op=Sum``, with
            Horovod's DeprecationWarning; giving ``op`` too is a ValueError.
        name: optional label (must be the same on every rank).
        compression: ``hvd.Compression.none`` or ``.fp16`` (float tensors travel as
            float16).
        op: ``Sum``, ``Average`` (None: Average), ``Min``, ``Max``, ``Product``, ``Adasum``.
        prescale_factor, postscale_factor: multiply before / after the reduction, as
            Horovod's CPU ScaleBuffer (:func:`collectives.framework.horovod._data.scale`); Average
            divides the postscale factor by the set's size (so integer averages truncate
            toward zero, as Horovod's).
        process_set: the ranks taking part (this rank must be one).

    Returns:
        New tensors of the inputs' types, dtypes and shapes (a 0-d input gives a 0-d
        result), the same on every rank of the set; torch tensors that require a gradient
        give results in the autograd graph (the gradient is allreduced alike).

    Raises:
        CollectiveTypeError: an unsupported dtype, bool, or Adasum of integers (on every
            rank of the set).
        ValueError: an unknown op, ``average`` and ``op`` both given (on every rank); this
            rank not in ``process_set`` (here only).
        CollectiveMismatchError: on every rank, when ranks disagree (shapes, dtypes, op,
            scale factors, name, number of tensors, kind of collective).
    """
    return _grouped(tensors, average, name, compression, op, prescale_factor,
                    postscale_factor, process_set, "grouped_allreduce", True)


def allreduce(tensor, average=None, name: str | None = None, compression=Compression.none,
              op=None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set):
    """Reduce ``tensor`` over the ranks of ``process_set`` (op None: Average, as the seeds
    and Horovod say), horovod.torch's positional order. Same arguments, result and errors
    as :func:`grouped_allreduce` for one tensor; returns a new tensor of its type."""
    return _grouped([tensor], average, name, compression, op, prescale_factor,
                    postscale_factor, process_set, "allreduce", False)[0]


def allreduce_(tensor, average=None, name: str | None = None, op=None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set):
    """:func:`allreduce` written into ``tensor`` (a writeable numpy array or a torch
    tensor, outside autograd); returns it.

    Raises:
        TypeError: ``tensor`` is neither (on every rank); and as :func:`allreduce`.
    """
    return _grouped([_detached(tensor)], average, name, Compression.none, op,
                    prescale_factor, postscale_factor, process_set, "allreduce_", False,
                    into=[tensor])[0]


def grouped_allreduce_(tensors: Sequence, average=None, name: str | None = None, op=None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list:
    """:func:`grouped_allreduce` written into ``tensors`` (writeable numpy arrays or torch
    tensors); returns them."""
    return _grouped([_detached(t) for t in tensors], average, name, Compression.none, op,
                    prescale_factor, postscale_factor, process_set, "grouped_allreduce_", True,
                    into=list(tensors))


def _detached(t):
    """A tensor outside the graph (in-place ops are not recorded, as horovod.torch's)."""
    return t.detach() if is_torch(t) else t
