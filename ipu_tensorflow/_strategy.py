"""The TF strategies' common base: a ``tf.distribute`` strategy whose replicas are ipupod's
replica threads on emulated IPUs (reference tf-keras-ipu.md §3).

To TensorFlow the strategy is a one-device strategy on the host CPU
(``tf.distribute.OneDeviceStrategy``). Variables made in its scope have one copy per local
replica, as on the IPU (:mod:`ipu_tensorflow._replica_variables`): inside ``run`` each
replica reads and writes its own copy (``v.assign_add``, an optimizer step), outside it a read
is replica 0's copy; the copies are made at the first ``run`` (until then every replica reads
the one copy the host updates: Keras ``fit``, :mod:`ipu_tensorflow._keras`).
Under the hood the replicas are those of the configured ipu_node system, run by the numpy
strategy of :mod:`collectives.strategies` (the same threads, replica contexts, IPUs and
occupancy as every other ipupod program, refused when no IPUs are free); their collectives are
ipupod's GCL collectives (:mod:`ipu_tensorflow._bridge`) over the job's transport. TF's own
collective ops and gRPC cluster are not used.

What differs by strategy (the table of §3.3): ``num_replicas_in_sync`` (1 for
``IPUStrategy``: gradients SUM over replicas; all replicas of the job for ``PopDistStrategy``:
MEAN), the host ``reduce`` (identity on one instance, over the instances otherwise), and the
checks of ``run`` (``IPUStrategy`` refuses eager functions and float64).

Variables made in the scope take instance 0's initial value (a host broadcast over the job
when it has several instances), on every replica's copy: every instance must make the same
variables in the same order, as in TF.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from ipu_node import current_replica_context
from ipu_node.runtime.system import current_system
from tensorflow.python.framework import ops

from ipu_tensorflow import _bridge, _replica_variables

__all__ = ["IPUStrategyBase", "TF1RunV2"]

#: the priority of the scope's variable creator: below ``tf.variable_creator_scope``'s (100,
#: called first), above the creator a ``tf.function`` adds while tracing its first call (50,
#: TF ``polymorphic_function.py``), so that it sees every other creator's arguments
_CREATOR_PRIORITY = 75


def _flat_dtypes(structure) -> list:
    return [getattr(t, "dtype", None) for t in tf.nest.flatten(structure)]


class IPUStrategyBase(tf.distribute.OneDeviceStrategy):
    """A TF strategy over ipupod's replicas.

    Args:
        numpy_strategy: the :mod:`collectives.strategies` strategy that runs the replicas and
            the host collectives (its checks of the system apply: e.g. ``IPUStrategy`` on a
            multi-instance job raises ValueError).
        enable_keras_extensions: Keras models constructed in scope get the IPU extension
            (:mod:`ipu_tensorflow._keras`).
    """

    #: what ``num_replicas_in_sync`` counts: "one" (TF sees one replica), "replicas" (every
    #: replica of the job, PopDist) or "processes" (the job's instances: one device each)
    _replicas_in_sync = "one"
    #: the class name TF-IPU's messages use
    _tf_ipu_name = "IPUStrategyV1"

    def __init__(self, numpy_strategy, enable_keras_extensions: bool = True):
        super().__init__("/device:CPU:0")
        self._numpy = numpy_strategy
        self._enable_keras_extensions = bool(enable_keras_extensions)
        self._replica_fns: dict = {}
        # the scope's per-replica variables (weak), and whether run has made their copies
        self._replica_variables: list[weakref.ref] = []
        self._copies_made = False

    # -- counts ----------------------------------------------------------------------------

    @property
    def num_replicas_in_sync(self) -> int:
        """1 (IPUStrategy: TF sees one replica; Poplar replicates), every replica of the job
        (PopDistStrategy) or the job's instances (the multi-worker and Horovod strategies)."""
        if self._replicas_in_sync == "one":
            return 1
        system = current_system()
        if system is None:
            return 1
        return system.num_replicas if self._replicas_in_sync == "replicas" else \
            system.process_count

    @property
    def num_local_replicas(self) -> int:
        """This instance's replicas (the configured system's)."""
        return self._numpy.num_local_replicas

    @property
    def num_total_replicas(self) -> int:
        """Every replica of the job."""
        return self._numpy.num_replicas_in_sync

    # -- scope: Keras extensions, variables from instance 0 --------------------------------

    @contextlib.contextmanager
    def scope(self):
        """TF's scope, plus: variables made here take instance 0's initial value and have a
        copy per local replica (:mod:`ipu_tensorflow._replica_variables`), and Keras models
        constructed here get the IPU extension (the ``Model.__new__`` that
        ``tensorflow.python.ipu`` installs looks for ``_enable_keras_extensions``)."""
        with super().scope(), ops.get_default_graph()._variable_creator_scope(
                self._create_variable, priority=_CREATOR_PRIORITY):
            yield self

    def _create_variable(self, next_creator, **kwargs):
        """The scope's variable creator. It runs after every ``tf.variable_creator_scope``
        creator (TF's strategy creator, which adds ``distribute_strategy``, and the user's)
        and in the place of TF's default creator: a variable made eagerly with several
        local replicas is constructed as a :class:`~ipu_tensorflow._replica_variables.
        ReplicaVariable`. A variable made in a function graph (one per instance, its
        initialisation lifted into the function's first call) is TF's: ``next_creator``."""
        replicas = self.num_local_replicas
        if tf.executing_eagerly() and replicas > 1:
            # (under tf.init_scope during a tf.function's first trace, TF's capturing creator
            # sits below: its variable would be an UnliftedInitializerVariable, which off
            # the function graph is a plain ResourceVariable; this one is not recorded as
            # the function's, so a later trace may make variables without TF's error)
            variable = _replica_variables.create(replicas, **kwargs)
        else:
            variable = next_creator(**kwargs)
        system = current_system()
        if system is not None and system.process_count > 1 and \
                current_replica_context() is None:
            with tf.init_scope():
                value = self._numpy.broadcast(np.asarray(variable.numpy()))
                variable.assign(value)
        if isinstance(variable, _replica_variables.ReplicaVariable):
            if self._copies_made:
                variable.materialize()
            self._replica_variables.append(weakref.ref(variable))
        return variable

    def _make_replica_copies(self) -> None:
        """Give every variable of the scope its copies per local replica (the first ``run``;
        variables made later get theirs when made)."""
        if not self._copies_made:
            self._copies_made = True
            for ref in self._replica_variables:
                variable = ref()
                if variable is not None:
                    variable.materialize()

    # -- run --------------------------------------------------------------------------------

    def _check_run(self, fn, args, kwargs) -> None:
        """Subclasses refuse what TF-IPU's ``run`` refuses."""

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict | None = None,
            options=None) -> Any:
        """Run ``fn(*args, **kwargs)`` on every local replica, each in its ipupod replica
        thread (a ``tf.function`` is traced once without XLA, the replica's index an input of
        the trace, :mod:`ipu_tensorflow._bridge`); every replica gets the same arguments.

        Variables made in the scope are each replica's own here: a replica's reads and
        writes use its copy (made from the host's value at the first ``run``,
        :mod:`ipu_tensorflow._replica_variables`).

        Returns:
            the last local replica's result (TF-IPU returns one value; which replica's is not
            documented, reference §3.1; ipupod takes the last, as Keras' NONE reduction).

        Raises:
            ValueError, TypeError: as TF-IPU for the strategy (``IPUStrategy``: an eager
                ``fn``; float64 inputs or outputs).
            The first exception a replica raised (collective errors name the op and the
            replicas).
        """
        kwargs = kwargs or {}
        self._check_run(fn, args, kwargs)
        self._make_replica_copies()
        key = getattr(fn, "python_function", fn)
        replica_fn = self._replica_fns.get(key)
        if replica_fn is None:
            replica_fn = self._replica_fns[key] = _bridge.replica_function(
                fn, lambda: tf.distribute.ReplicaContext(self, replica_id_in_sync_group=0))
        def in_replica(r):
            return _bridge.call_unwrapped(r, replica_fn, tf.constant(r, tf.int32), *args,
                                          **kwargs)
        return self.run_replicas(in_replica)[-1]

    def run_replicas(self, fn: Callable[[int], Any]) -> list:
        """``fn(local_replica_index)`` on every local replica, each in its replica thread with
        this strategy's scope entered there; results in local order."""
        def in_replica(_):
            with self.scope():
                return fn(current_replica_context().local_index)
        return self._numpy.run(in_replica, args=(None,))

    # -- host collectives ---------------------------------------------------------------------

    def reduce(self, reduce_op, value, axis=None):
        """``value`` reduced over ``axis`` (a dimension of each tensor), then, on a job of
        several instances, SUM or MEAN over the instances (the host reduce of PopDist;
        identity on one instance, TFI ``ipu_strategy.py:325-326``).

        Raises:
            ValueError: a reduce op other than SUM or MEAN ("Unsupported reduce op: X").
        """
        op = reduce_op if isinstance(reduce_op, str) else getattr(reduce_op, "value", reduce_op)
        if op not in ("SUM", "MEAN"):
            raise ValueError(f"Unsupported reduce op: {reduce_op}")
        if axis is not None:
            value = tf.nest.map_structure(
                lambda t: (tf.reduce_sum if op == "SUM" else tf.reduce_mean)(t, axis=axis), value)
        system = current_system()
        if system is None or system.process_count == 1:
            return value
        dtypes = _flat_dtypes(value)
        host = self._numpy.reduce(op, tf.nest.map_structure(lambda t: np.asarray(t), value))
        flat = [tf.constant(a, dtype=d) if d is not None else a
                for a, d in zip(tf.nest.flatten(host), dtypes)]
        return tf.nest.pack_sequence_as(value, flat)

    def broadcast(self, value):
        """Instance 0's ``value`` (a tensor or nest) on every instance."""
        dtypes = _flat_dtypes(value)
        host = self._numpy.broadcast(tf.nest.map_structure(lambda t: np.asarray(t), value))
        return tf.nest.pack_sequence_as(
            value, [tf.constant(a, dtype=d) for a, d in zip(tf.nest.flatten(host), dtypes)])

    def update_ipu_config(self, config):
        """Write the job's multi-replica distribution into ``config`` (TFI
        ``popdist_strategy.py:78-91``); returns it (harmless where TF-IPU returns None,
        reference §9 #7)."""
        return self._numpy.update_ipu_config(config)

    def experimental_run_v2(self, fn, args=(), kwargs=None, options=None):
        """Deleted in SDK 3.x (TFI ``ipu_strategy.py:211-213``).

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("`experimental_run_v2` has been deleted. Use `run` instead.")


class TF1RunV2:
    """``experimental_run_v2`` kept on the TF1-era strategies (multi-worker, Horovod,
    PopDist), as TF 1.15 has it (reference §1.4, §9 #10): :meth:`run`."""

    def experimental_run_v2(self, fn, args=(), kwargs=None, options=None):
        return self.run(fn, args, kwargs, options)

