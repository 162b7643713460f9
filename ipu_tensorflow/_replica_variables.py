"""Variables made in an IPU strategy's scope: one copy per local replica, as on the IPU
(reference tf-keras-ipu.md §3; execution-model.md "Variables live on a replica's IPUs").

On the IPU every replica holds its own copy of every variable, initialised identically
(instance 0's initial values) and kept identical only by the program's own cross-replica
reductions: a ``v.assign_add(x)`` or an optimizer step inside ``strategy.run`` updates each
replica's copy once, with that replica's values. A :class:`ReplicaVariable` is that on
stock TensorFlow: a ``ResourceVariable`` (the object Keras, checkpoints and the user hold)
whose copy 0 is itself and whose copies 1..R-1 are plain variables beside it.

**Which copy an op uses.** Every op of a ``ResourceVariable`` goes through its ``handle``:

* in a traced function (a ``tf.function`` or a loop or branch in it), ``handle`` is a
  *call-time capture* of the function (``FuncGraph.capture_call_time_value``, the mechanism
  of TF's ``PerWorkerVariable``): one trace serves every replica, as one Poplar program
  does, and each call binds the copy of the replica that calls it (the ipu_node replica
  context of the calling thread; no replica: copy 0). The capture has one key per variable,
  so every op of one function uses one handle and TF's automatic control dependencies keep
  the reads and writes in program order. Loops and branches capture it from the enclosing
  function (cond_v2 does not carry call-time captures, while_v2 does; the forwarding in
  :func:`_install_forwarding` makes both ordinary captures of the function's one);
* eagerly, ``handle`` (and ``_handle``, which TF's C++ fast path of an eager op reads
  from a variable input) is the copy of the replica this thread runs (an eager function
  run by ``PopDistStrategy.run``, a pipeline's stages), else copy 0.

So **a read outside ``strategy.run`` is replica 0's copy** (this instance's first replica),
as TF-IPU's host read of a replicated variable is; ``get_weights``, ``save_weights`` and
checkpoints save it. **A write outside ``run``** made eagerly (``assign``, ``assign_add``,
the scatter updates, ``set_weights``, ``load_weights``, a checkpoint restore) writes every
copy. A write from a ``tf.function`` called outside ``run`` writes copy 0 only (it is one
program on one replica); Keras ``fit`` copies its update to the other copies itself
(:func:`sync_copies`).

**Copies on demand.** The copies exist once :meth:`ReplicaVariable.materialize` has run: the
strategy's ``run`` materializes every variable of its scope before its replicas start (and
a variable made later, e.g. an optimizer's slot made while ``run`` traces, at once), from
copy 0's value at that moment. Until then every replica reads copy 0, which is exact while
nothing but the host writes (Keras ``fit``, which applies the reduced update once); a job
of one local replica never makes copies. Variables made inside a function graph without
``tf.init_scope`` (TF lifts their initialisation into the function's first call) stay one
per instance; Keras layers and optimizers make theirs under ``init_scope``.

**Construction.** The strategy's variable creator constructs a variable of this kind
directly (:func:`create`, in the place of TF's default creator, after every other creator);
no object's class is changed after construction. A variable made under ``tf.init_scope``
while a ``tf.function`` traces its first call is constructed so too, where TF's capturing
creator would have made an ``UnliftedInitializerVariable`` (off the function graph, a plain
``ResourceVariable``) and recorded it as the function's: such a function is not told it
made variables, so a later trace of it may make more without TF's "tf.function only
supports singleton tf.Variables" error.
"""

from __future__ import annotations

import threading

import tensorflow as tf
from ipu_node import current_replica_context
from tensorflow.python.distribute.ps_values import PerWorkerVariableSpec
from tensorflow.python.framework import func_graph as _func_graph
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_v2_func_graphs as _control_flow
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import save_context

__all__ = ["ReplicaVariable", "create", "sync_copies"]

#: the class of the copies of replicas 1..R-1
_Copy = resource_variable_ops.ResourceVariable


class _CaptureKey:
    """The key of one variable's call-time capture (one placeholder per function graph)."""

    __slots__ = ("__weakref__",)


def _local_index() -> int | None:
    context = current_replica_context()
    return None if context is None else context.local_index


def _function_graph(graph):
    """The innermost graph around ``graph`` that is a function's, not a loop's or branch's."""
    while isinstance(graph, _control_flow.ControlFlowFuncGraph):
        graph = graph.outer_graph
    return graph


def _capture(graph, closure, spec, key, default_value):
    """``closure``'s call-time capture in the function around ``graph``, captured into
    ``graph`` as an ordinary tensor when ``graph`` is a loop body or a branch."""
    target = _function_graph(graph)
    placeholder = _CAPTURE_CALL_TIME_VALUE(target, closure, spec, key=key,
                                           default_value=default_value)
    _lean_binding(target, closure, spec, key, default_value, placeholder)
    return placeholder if target is graph else graph.capture(placeholder)


def _lean_binding(graph, closure, spec, key, default_value, placeholder) -> None:
    """Bind the capture at each call with ``closure`` itself, in place of TF's wrapper, which
    checks the handle against ``spec`` at every call (about 40 us a variable a call, measured
    here: 8 variables took a function call from 1.04 to 1.32 ms; a Keras model's step reads
    every weight). Does what TF's wrapper does otherwise: the default value while saving, a
    capture in the enclosing trace when a nested function is called while tracing."""
    captures = getattr(graph, "_function_captures", None)
    if captures is None or getattr(captures.by_ref_external.get(key), "ipupod_lean", False):
        return

    def bind():
        if save_context.in_save_context():
            return default_value
        if tf.executing_eagerly():
            return closure()
        return _capture(ops.get_default_graph(), closure, spec, key, default_value)
    bind.ipupod_lean = True
    captures.add_or_replace(key=key, external=bind, internal=placeholder,
                            tracetype=captures.by_ref_tracetype[key], is_by_ref=True)


_CAPTURE_CALL_TIME_VALUE = _func_graph.FuncGraph.capture_call_time_value
_lock = threading.Lock()


def _install_forwarding() -> None:
    """Make a loop body's or branch's call-time capture of a :class:`ReplicaVariable` (TF
    re-captures one there when a traced function calls a nested ``tf.function``) a capture
    of the enclosing function's; every other key keeps TF's behaviour."""
    with _lock:
        cls = _control_flow.ControlFlowFuncGraph
        if "capture_call_time_value" in cls.__dict__:
            return

        def capture_call_time_value(self, closure, spec, key=None, default_value=None,
                                    placeholder=None):
            if isinstance(key, _CaptureKey) and placeholder is None:
                return _capture(self, closure, spec, key, default_value)
            return _CAPTURE_CALL_TIME_VALUE(self, closure, spec, key=key,
                                            default_value=default_value,
                                            placeholder=placeholder)
        cls.capture_call_time_value = capture_call_time_value


class ReplicaVariable:
    """A ``tf.Variable`` with one copy per local replica (module docstring). Made by the IPU
    strategies' variable creator: :func:`create` constructs a ``ResourceVariable`` subclass
    with this class first in its bases; everything else is ``ResourceVariable``'s.

    Reads outside ``strategy.run`` give replica 0's copy; eager writes outside ``run`` write
    every copy; inside ``run`` each replica reads and writes its own.
    """

    # set by the constructor: the local replicas, the copies 1..R-1 (None until materialized),
    # the capture key
    _ipupod_replicas: int
    _ipupod_copies: list | None
    _ipupod_key: _CaptureKey

    @property
    def handle(self):
        """The handle of the calling replica's copy (module docstring)."""
        if tf.executing_eagerly() or save_context.in_save_context():
            return self._replica_handle()
        graph = ops.get_default_graph()
        if not isinstance(graph, _func_graph.FuncGraph):
            return self._first_handle
        return _capture(graph, self._replica_handle,
                        PerWorkerVariableSpec(value=self._first_handle), self._ipupod_key,
                        self._first_handle)

    def _replica_handle(self):
        copies, index = self._ipupod_copies, _local_index()
        if copies is None or not index:
            return self._first_handle
        return copies[index - 1]._handle

    @property
    def _first_handle(self):
        """Copy 0's handle (the variable TF made)."""
        return self.__dict__["_handle"]

    @property
    def _handle(self):
        """What TF's own code reads as the variable's resource: eagerly, the calling
        replica's copy's handle, as :attr:`handle` (TF's C++ fast path of an eager op reads
        a variable input's ``_handle``, not ``handle``: ``tf.matmul(x, v)``, ``g - v``, an
        optimizer's update of its slots; without this a replica would read copy 0 there and
        write its own copy); copy 0's in a graph (:attr:`handle` binds the replica's there)."""
        if self.__dict__.get("_ipupod_copies") and tf.executing_eagerly():
            return self._replica_handle()
        return self._first_handle

    @_handle.setter
    def _handle(self, value):
        self.__dict__["_handle"] = value

    @property
    def materialized(self) -> bool:
        """Whether the copies of replicas 1..R-1 exist (module docstring)."""
        return self._ipupod_copies is not None

    def materialize(self) -> None:
        """Make the copies of replicas 1..R-1 from copy 0's value, if not made yet."""
        if self._ipupod_copies is not None:
            return
        with tf.init_scope(), ops.device(self._first_handle.device):
            value = _read(self._first_handle, self.dtype)
            self._ipupod_copies = [
                _Copy(initial_value=value, trainable=False, shape=self.shape,
                      dtype=self.dtype, name=f"{self._shared_name}/replica_{r}")
                for r in range(1, self._ipupod_replicas)]

    def read_all(self) -> list[tf.Tensor]:
        """The value of every local replica's copy, replica 0 first (R tensors of the
        variable's shape and dtype; one while the copies are not made), read eagerly."""
        with tf.init_scope():
            first = _read(self._first_handle, self.dtype)
            return [first] + [_read(c._handle, self.dtype)
                              for c in (self._ipupod_copies or [])]

    def sync_copies(self) -> None:
        """Copy 0's value into every other copy (eagerly)."""
        if not self._ipupod_copies:
            return
        with tf.init_scope():
            value = _read(self._first_handle, self.dtype)
            for copy in self._ipupod_copies:
                copy.assign(value)

    def _after_host_write(self) -> None:
        if self._ipupod_copies and tf.executing_eagerly() and _local_index() is None:
            self.sync_copies()

    def _restore_from_tensors(self, restored_tensors):
        """``ResourceVariable``'s restore, on every copy (eagerly outside a replica)."""
        restored = super()._restore_from_tensors(restored_tensors)
        self._after_host_write()
        return restored


def _read(handle, dtype):
    """The value behind a resource ``handle`` (one ``ReadVariableOp``)."""
    return resource_variable_ops.gen_resource_variable_ops.read_variable_op(handle, dtype)


def _host_writing(name: str):
    def write(self, *args, **kwargs):
        result = getattr(super(ReplicaVariable, self), name)(*args, **kwargs)
        self._after_host_write()
        return result
    write.__name__ = write.__qualname__ = name
    write.__doc__ = f"``ResourceVariable.{name}``; eagerly outside a replica, on every copy."
    return write


for _name in ("assign", "assign_add", "assign_sub", "scatter_sub", "scatter_add",
              "scatter_max", "scatter_min", "scatter_mul", "scatter_div", "scatter_update",
              "batch_scatter_update", "scatter_nd_sub", "scatter_nd_add", "scatter_nd_update",
              "scatter_nd_max", "scatter_nd_min"):
    setattr(ReplicaVariable, _name, _host_writing(_name))
del _name


class _ReplicaResourceVariable(ReplicaVariable, resource_variable_ops.ResourceVariable):
    """A ``ResourceVariable`` with one copy per local replica, constructed as such by
    :func:`create` (no class is changed after construction). Named as TF's class, so that
    what reads a variable's class name (messages, reprs) reads what stock TF gives."""

    def __init__(self, *, replicas: int, **kwargs):
        # set before TF's constructor, which may read ``handle`` (copy 0 until materialized)
        self._ipupod_replicas = int(replicas)
        self._ipupod_copies = None
        self._ipupod_key = _CaptureKey()
        super().__init__(**kwargs)


_ReplicaResourceVariable.__name__ = _ReplicaResourceVariable.__qualname__ = "ResourceVariable"
_ReplicaResourceVariable.__module__ = resource_variable_ops.ResourceVariable.__module__

#: the creator arguments TF's default creator passes to ``ResourceVariable`` (TF
#: ``resource_variable_ops.default_variable_creator_v2``); the others (``colocate_with``,
#: ``use_resource``, ...) are for creators above it
_CONSTRUCTOR_KWARGS = ("initial_value", "trainable", "validate_shape", "caching_device",
                       "name", "dtype", "constraint", "variable_def", "import_scope",
                       "distribute_strategy", "synchronization", "aggregation", "shape",
                       "experimental_enable_variable_lifting")


def create(replicas: int, **kwargs):
    """A :class:`ReplicaVariable` of ``replicas`` local replicas (a ``ResourceVariable``
    subclass), made eagerly from a variable creator's keyword arguments as TF's default
    creator makes its ``ResourceVariable`` (the arguments it takes: ``initial_value``,
    ``trainable``, ``name``, ``dtype``, ``shape``, ...; the rest are ignored, as TF's creator
    ignores them). Its copies 1..R-1 are made by :meth:`ReplicaVariable.materialize`.

    Raises:
        ValueError: ``replicas`` < 2 (one replica keeps TF's plain variable), or not
            executing eagerly (a variable made in a function graph is TF's, lifted into
            the function's first call).
    """
    if replicas < 2:
        raise ValueError(f"a ReplicaVariable needs 2 or more local replicas, got {replicas}")
    if not tf.executing_eagerly():
        raise ValueError("a ReplicaVariable is made eagerly (under tf.init_scope in a "
                         "function); this variable is being made in a function graph")
    _install_forwarding()
    return _ReplicaResourceVariable(
        replicas=replicas, **{k: kwargs[k] for k in _CONSTRUCTOR_KWARGS if k in kwargs})


def sync_copies(variables) -> None:
    """:meth:`ReplicaVariable.sync_copies` on each :class:`ReplicaVariable` of
    ``variables`` (others are skipped): after the host updated copy 0 in a function (Keras'
    update)."""
    for variable in variables:
        if isinstance(variable, ReplicaVariable):
            variable.sync_copies()
