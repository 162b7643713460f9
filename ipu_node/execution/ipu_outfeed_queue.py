"""``IPUOutfeedQueue``: values the replicas send to the host [004:262-480].

What :meth:`IPUOutfeedQueue.dequeue` returns, for a per-step value of shape ``s`` enqueued
``n`` times by each of ``R`` replicas (TF-IPU [004:359, 386-388; PE:130-140]):

============  ================  ==============
mode          R > 1             R = 1
============  ================  ==============
ALL           ``[n, R, *s]``    ``[n, *s]``
LAST          ``[R, *s]``       ``s``
============  ================  ==============

Tuples, lists, namedtuples and dicts keep their structure; each leaf gets the shape of the
table. Seed quirk: the seed writes ``[20, 1]`` for ``tf.reduce_sum(output)`` [004:386], but that
value is a scalar (shape ``()``), so ipupod gives ``[20]`` (ALL, R = 1), as TF does at run time.
A LAST scalar with R = 1 comes back as a numpy scalar (IOT checks ``isinstance(outfed,
np.float32)``).

*R is the number of replicas whose values this instance holds*: its local replicas, in local
order. In a multi-instance job (poprun) each instance dequeues the values of its own replicas,
as TF-IPU with popdist does; gather them across instances with collectives if needed. Outside
replica functions the caller is replica 0 of 1.

Eager emulation:

* An enqueue is one per *step* and replica: per iteration of the innermost loop, or per
  compiled computation outside loops (``loops.current_step``); a second one raises TF-IPU's
  "An outfeed can only be enqueued once." Outside loops and compile there is no step, and
  every call is allowed.
* ``dequeue`` drains: ALL returns every value enqueued since the last dequeue (a second
  dequeue gives ``n = 0``), LAST returns the last value and clears it, as the Poplar executor
  does. Iterating the queue yields the ALL values one step at a time and drains them.
* ``dequeue(wait_for_completion=...)``: computations run synchronously, so after ``compile``
  returns everything is there. If replicas are still running (another thread), only the
  steps that every local replica has finished are returned; the rest stay queued.
"""

from __future__ import annotations

import enum
import itertools
import threading
from typing import Any, Iterator

import numpy as np

from ipu_node import nest as _nest
from ipu_node.errors import FailedPreconditionError, InvalidArgumentError
from ipu_node.execution.ipu_infeed_queue import check_deprecated, check_device_ordinal
from ipu_node.execution.loops import current_step
from ipu_node.execution.operation import Operation
from ipu_node.runtime.replica import current_replica_context

__all__ = ["IPUOutfeedMode", "IPUOutfeedQueue"]

_DEPRECATED = {
    "feed_name": "No change needed. feed_name is now automatically generated.",
    "replication_factor": "No change needed. replication_factor is now set automatically "
                          "based on the model.",
    "io_batch_size": "Accumulate the results manually or use accumulate_outfeed when using "
                     "pipelining.",
}
_uids = itertools.count()


class IPUOutfeedMode(enum.Enum):
    """``ALL``: every enqueued element is returned; ``LAST``: only the last one [004:264-272].
    LAST's value is ``'get_last'`` [004:3102]."""

    ALL = "all"
    LAST = "get_last"


class IPUOutfeedQueue:
    """Collects values enqueued by the replicas for the host.

    Args:
        outfeed_mode: an :class:`IPUOutfeedMode`; None means ``ALL``.
        device_ordinal: the TF device (``/device:IPU:<ordinal>``); recorded.
        **deprecated: ``feed_name`` (used in messages when given), ``replication_factor`` and
            ``io_batch_size`` (ignored); each warns (DeprecationWarning).

    Raises:
        ValueError: ``outfeed_mode`` is not an IPUOutfeedMode.
        TypeError: an unknown keyword argument, or a non-integer ``device_ordinal``.
    """

    def __init__(self, outfeed_mode: IPUOutfeedMode | None = None, device_ordinal: int = 0,
                 **deprecated: Any):
        check_deprecated("IPUOutfeedQueue", deprecated, _DEPRECATED)
        mode = outfeed_mode or IPUOutfeedMode.ALL
        if not isinstance(mode, IPUOutfeedMode):
            raise ValueError("Expected `outfeed_mode` value to be of "
                             "`ipu_outfeed_queue.IPUOutfeedMode` type, but is "
                             f"{type(outfeed_mode)}.")
        self._mode = mode
        self._device_ordinal = check_device_ordinal(device_ordinal)
        name = deprecated.get("feed_name")
        self._feed_name = str(name) if name is not None else f"outfeed{next(_uids)}"
        self._lock = threading.Lock()
        self._treedef: Any = None
        self._specs: list | None = None          # (shape, dtype) per leaf, from the first
        self._num_local: int | None = None
        self._values: dict[int, list] = {}      # local replica -> flat leaves per step
        self._last_step: dict[int, Any] = {}    # local replica -> step of its last enqueue

    @property
    def outfeed_mode(self) -> IPUOutfeedMode:
        """ALL or LAST."""
        return self._mode

    @property
    def feed_name(self) -> str:
        """The name in error messages: ``feed_name`` if given, else ``outfeed<N>``."""
        return self._feed_name

    @property
    def enqueued(self) -> bool:
        """Whether anything was ever enqueued."""
        return self._treedef is not None

    @property
    def deleter(self) -> Operation:
        """Drops every queued value; the queue forgets its structure."""
        with self._lock:
            self._treedef = self._specs = self._num_local = None
            self._values.clear()
            self._last_step.clear()
        return Operation(f"{self._feed_name}/deleter")

    def enqueue(self, tensors: Any) -> Operation:
        """Queue ``tensors`` (an array, or a tuple/list/dict nest of arrays) of the calling
        replica for the host; a copy is taken.

        Returns:
            An :class:`Operation` to return from the loop body after its tensors.

        Raises:
            ValueError: a second enqueue in the same step ("An outfeed can only be enqueued
                once."); dict keys that are not strings; a structure, shape or dtype other
                than the first enqueue's.
            InvalidArgumentError: a dimension of size 0.
        """
        ctx = current_replica_context()
        local, num_local = (0, 1) if ctx is None else (ctx.local_index, ctx.num_local_replicas)
        leaves, treedef = _nest.flatten(tensors)
        _check_keys(tensors)
        arrays = [np.array(leaf, copy=True) for leaf in leaves]
        if any(0 in a.shape for a in arrays):
            raise InvalidArgumentError(
                "Detected an input tensor to an outfeed queue with a dimension of size 0. "
                "Please remove it from the inputs.")
        specs = [(a.shape, a.dtype) for a in arrays]
        step = current_step()
        with self._lock:
            if step is not None and self._last_step.get(local) == step:
                raise ValueError("An outfeed can only be enqueued once.")
            if self._treedef is None:
                self._treedef, self._specs, self._num_local = treedef, specs, num_local
            else:
                self._check_same(treedef, specs, num_local)
            self._last_step[local] = step
            values = self._values.setdefault(local, [])
            if self._mode is IPUOutfeedMode.LAST:
                values.clear()  # LAST keeps one value per replica
            values.append(arrays)
        return Operation(f"{self._feed_name}/enqueue")

    def _check_same(self, treedef: Any, specs: list, num_local: int) -> None:
        if treedef != self._treedef:
            raise ValueError(
                f"IPUOutfeedQueue {self._feed_name!r}: enqueued {_nest.describe(treedef)}, "
                f"but the first enqueue was {_nest.describe(self._treedef)}")
        if specs != self._specs:
            raise ValueError(
                f"IPUOutfeedQueue {self._feed_name!r}: enqueued shapes/dtypes "
                f"{_fmt(specs)}, but the first enqueue had {_fmt(self._specs)}")
        if num_local != self._num_local:
            raise ValueError(
                f"IPUOutfeedQueue {self._feed_name!r}: enqueued from {num_local} local "
                f"replica(s), but first from {self._num_local}")

    def dequeue(self, wait_for_completion: bool = False) -> Any:
        """The queued values with the shapes of the module's table, draining the queue.

        Raises:
            ValueError: nothing was ever enqueued ("Trying to dequeue an outfeed which has
                not been enqueued.").
            FailedPreconditionError: LAST mode with no value since the last dequeue.
        """
        with self._lock:
            if self._treedef is None:
                raise ValueError("Trying to dequeue an outfeed which has not been enqueued.")
            steps = self._take_steps()
            if self._mode is IPUOutfeedMode.LAST:
                if not steps:
                    raise FailedPreconditionError(
                        "Trying to get the last value from an outfeed queue before it was "
                        "executed. Make sure the outfeed dequeue TensorFlow operation is "
                        "executed after the enqueue to the outfeed has completed.")
                return self._assemble([steps[-1]], last=True)
            return self._assemble(steps, last=False)

    def __iter__(self) -> Iterator[Any]:
        """Each queued step (ALL: ``[R, *s]`` or ``s``), oldest first, draining the queue;
        nothing when nothing is queued (or never enqueued)."""
        with self._lock:
            steps = self._take_steps() if self._treedef is not None else []
        for step in steps:
            yield self._assemble([step], last=True)

    def _take_steps(self) -> list[list[list[np.ndarray]]]:
        """Remove and return the steps every local replica has finished:
        ``steps[t][replica][leaf]``. LAST keeps no older steps."""
        per_replica = [self._values.get(r, []) for r in range(self._num_local)]
        n = min(len(v) for v in per_replica)
        steps = [[per_replica[r][t] for r in range(self._num_local)] for t in range(n)]
        for values in per_replica:
            del values[:n]
        if self._mode is IPUOutfeedMode.LAST:
            for values in per_replica:
                values.clear()
        return steps

    def _assemble(self, steps: list, last: bool) -> Any:
        replicated = self._num_local > 1
        out = []
        for c, (shape, dtype) in enumerate(self._specs):
            if last:
                per_replica = [v[c] for v in steps[0]]
                arr = np.stack(per_replica) if replicated else per_replica[0]
                arr = arr[()] if arr.ndim == 0 else arr
            else:
                lead = (len(steps), self._num_local) if replicated else (len(steps),)
                arr = np.empty(lead + shape, dtype)
                for t, step in enumerate(steps):
                    for r, v in enumerate(step):
                        arr[(t, r) if replicated else t] = v[c]
            out.append(arr)
        return _nest.unflatten(self._treedef, out)

    def __repr__(self) -> str:
        return f"IPUOutfeedQueue({self._feed_name!r}, outfeed_mode={self._mode})"


def _check_keys(tensors: Any) -> None:
    if isinstance(tensors, dict):
        if not all(isinstance(k, str) for k in tensors):
            raise ValueError("Expected all keys in the outfeed dictionary to be strings.")
        for v in tensors.values():
            _check_keys(v)
    elif isinstance(tensors, (list, tuple)):
        for v in tensors:
            _check_keys(v)


def _fmt(specs: list) -> str:
    return ", ".join(f"{list(s)}:{d}" for s, d in specs)
