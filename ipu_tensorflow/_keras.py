"""Keras under the IPU strategies (GK ``keras/ipu/extensions/``; reference tf-keras-ipu.md §4):
the extended class of models constructed in scope, and ``fit``/``evaluate``/``predict`` on
ipupod's replicas.

**Extended class.** A tf-keras ``Model`` (Sequential, Functional or subclassed) constructed
while an IPU strategy's scope is active (and the strategy has ``enable_keras_extensions``) is
an instance of ``(KerasExtension, its class)`` — the extension first in the bases, as stock
tf-keras needs (reference §1.3, RN E12); the original class is ``__original_class__``.
TF-IPU swaps the class in ``Layer.__init__`` (GK ``base_layer.py:442-445``); ipupod
constructs the instance of the extended class in the first place (``Model.__new__``), so no
object's class changes after construction (issue 31).

**Execution.** ``fit`` splits the data as TF-IPU does: batch i goes to local replica
i % R, and ``steps_per_epoch``/``steps`` count batches over all local replicas (each runs
``steps // R``). Each replica computes its gradients with a ``tf.function`` of its own (its
own copies of the compiled loss and metrics containers, so each replica's metrics are its own
as on the IPU) in its ipupod replica thread; the G accumulated micro-batch gradients of a
window (SUM, MEAN or RUNNING_MEAN) are summed over every replica of the job by ONE fused
``collectives.cross_replica_sum`` (GCL's canonical tree: layout-invariant, bit-identical);
the optimizer applies the reduced gradient once per instance, to replica 0's copy of the
variables (the copies of the other replicas exist once a custom ``strategy.run`` made them,
:mod:`ipu_tensorflow._replica_variables`; until then every replica reads that one copy; after,
the update is copied to theirs). An instance of one replica without accumulation
does all of it in the replica's step function (the sum a bridged op,
:mod:`ipu_tensorflow._bridge`; nothing to sum in a job of one replica) and runs an
execution's steps in one call of its replica thread. Keras divides the loss by the strategy's
``num_replicas_in_sync`` (1 for IPUStrategy: a SUM over replicas; all replicas for
PopDistStrategy: a MEAN).

Per-batch callbacks run once per execution (``steps_per_execution`` steps of each replica);
logs are the metrics of the last replica, or their reduction over the replicas
(``set_replication_options``).
"""

from __future__ import annotations

import logging
import threading

import tensorflow as tf

from ipu_tensorflow.keras.pipelining.extension import (PipeliningExtension,
                                                       refuse_overrides)
from ipu_tensorflow._keras_options import (GradientAccumulationReductionMethod as _GA,
                                           ReplicatedMetricReductionMethod as _MR,
                                           parse_accumulation_reduction,
                                           parse_metric_reduction)

__all__ = ["extended_class", "KerasExtension", "install"]

logger = logging.getLogger("tensorflow")

_patch_lock = threading.Lock()
_patched: dict = {}
_classes: dict = {}


def _keras():
    from tf_keras.src.engine import training
    return training


def _current_ipu_strategy():
    """The current strategy when it is an IPU strategy with Keras extensions (the strategies
    of :mod:`ipu_tensorflow._strategy` carry ``_enable_keras_extensions``; that module
    imports this one)."""
    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    return strategy if getattr(strategy, "_enable_keras_extensions", False) else None


def install() -> None:
    """Install the construction of extended models in tf-keras' ``Model.__new__`` (once per
    process; importing ``tensorflow.python.ipu`` does)."""
    _install()


def _install() -> None:
    with _patch_lock:
        if _patched:
            return
        training = _keras()
        model_class = training.Model
        original_new = model_class.__dict__["__new__"].__func__

        def __new__(cls, *args, **kwargs):
            # tf.keras.Model(inputs, outputs) is tf-keras' redirect to Functional, whose own
            # construction comes back here for the class
            if not issubclass(cls, KerasExtension) and _current_ipu_strategy() is not None \
                    and not (cls is model_class and
                             training.is_functional_model_init_params(args, kwargs)):
                cls = extended_class(cls)
            return original_new(cls, *args, **kwargs)

        model_class.__new__ = staticmethod(__new__)
        _patched["new"] = original_new


def extended_class(cls):
    """``cls`` with :class:`KerasExtension` first in its bases (cached per class)."""
    if issubclass(cls, KerasExtension):
        return cls
    with _patch_lock:
        extended = _classes.get(cls)
        if extended is None:
            extended = type(cls.__name__, (KerasExtension, cls),
                            {"__original_class__": cls, "__module__": cls.__module__,
                             "__qualname__": cls.__qualname__})
            _classes[cls] = extended
        return extended


#: the methods a model may not override under an IPU strategy (reference §4.6)
_NOT_OVERRIDABLE = ("train_step", "make_train_function", "make_test_function",
                    "make_predict_function")


class KerasExtension(PipeliningExtension):
    """The IPU extension of a Keras model (its methods come first in the MRO)."""

    # -- options ------------------------------------------------------------------------------

    def _ipu_options(self) -> dict:
        opts = self.__dict__.get("_ipu_opts")
        if opts is None:
            opts = {"G": 1, "ga_method": _GA.SUM, "metric_reduction": _MR.NONE}
            self.__dict__["_ipu_opts"] = opts
        return opts

    def set_gradient_accumulation_options(self, gradient_accumulation_steps_per_replica=None,
                                          gradient_accumulation_reduction_method="sum",
                                          use_v2_gradient_accumulation_optimizer=False,
                                          **gradient_accumulation_optimizer_kwargs):
        """Accumulate G micro-batches' gradients on each replica before one reduction and
        one weight update (GK ``functional_extensions.py:108-178``).

        Raises:
            ValueError: G not a positive integer; a bad reduction method; the keyword
                arguments ``opt``, ``num_mini_batches``, ``experimental_normalize_gradients``.
        """
        G = gradient_accumulation_steps_per_replica
        if G is not None and (not isinstance(G, int) or isinstance(G, bool) or G < 1):
            raise ValueError("Expected `gradient_accumulation_steps_per_replica` to be a "
                             f"positive integer, but got {G} instead.")
        for key in ("opt", "num_mini_batches", "experimental_normalize_gradients"):
            if key in gradient_accumulation_optimizer_kwargs:
                raise ValueError(f"Found `{key}` key in `gradient_accumulation_optimizer_"
                                 "kwargs`. This argument is automatically set by Keras.")
        opts = self._ipu_options()
        opts["G"] = G or 1
        opts["ga_method"] = parse_accumulation_reduction(gradient_accumulation_reduction_method)
        self._ipu_reset_functions()

    def set_replication_options(self, replicated_metric_reduction_method="NONE"):
        """How each metric's per-replica values combine in the logs (GK
        ``extensions_base.py:589-611``): NONE (the last replica's), LIST, SUM, MEAN."""
        self._ipu_options()["metric_reduction"] = parse_metric_reduction(
            replicated_metric_reduction_method)

    def set_asynchronous_callbacks(self, asynchronous=False):
        """Accepted; ipupod calls the callbacks synchronously, once per execution."""
        self._ipu_options()["async_callbacks"] = bool(asynchronous)

    # -- compile ---------------------------------------------------------------------------

    def compile(self, optimizer="rmsprop", loss=None, metrics=None, loss_weights=None,
                weighted_metrics=None, run_eagerly=None, steps_per_execution=None,
                jit_compile=None, **kwargs):
        """tf-keras' ``compile``; ``steps_per_execution`` counts each replica's steps per
        execution (None: 1); resets the compiled IPU functions."""
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics,
                        loss_weights=loss_weights, weighted_metrics=weighted_metrics,
                        run_eagerly=run_eagerly, steps_per_execution=steps_per_execution,
                        jit_compile=False, **kwargs)
        opts = self._ipu_options()
        opts["compile"] = dict(loss=loss, metrics=metrics, loss_weights=loss_weights,
                               weighted_metrics=weighted_metrics)
        opts["spe"] = int(steps_per_execution or 1)
        self._ipu_reset_functions()

    def _ipu_reset_functions(self) -> None:
        self.__dict__["_ipu_fns"] = {}

    # -- checks ----------------------------------------------------------------------------

    def _ipu_check(self, pipelined: bool = False) -> None:
        """Refusals of reference §4.6.

        Raises:
            RuntimeError: eager Keras; an overridden step function.
        """
        if self.run_eagerly:
            raise RuntimeError("Keras models cannot run eagerly when using `IPUStrategy`. "
                               "Set `run_eagerly=False` when calling `compile`.")
        original = type(self).__original_class__
        model_class = _keras().Model
        refuse_overrides(self, original, [(name, model_class) for name in _NOT_OVERRIDABLE])

    @property
    def _ipu_strategy(self):
        return self.distribute_strategy

    def modelReport(self):
        """ipupod's account of this model (an ipupod extension, PopTorch's
        ``model.modelReport()`` for Keras): its stage, memory per IPU (bytes by kind, and the
        IPU's capacity) and modelled step (seconds), a
        :class:`collectives.performance.model_report.ModelReport`
        (:mod:`ipu_tensorflow._keras_memory`); ``ModelCard.from_run(run=model.modelReport())``
        prices it on any POD.

        Raises:
            RuntimeError: the model has not been fitted since it was compiled.
        """
        from ipu_tensorflow._keras_memory import model_report
        report = model_report(self)
        if report is None:
            raise RuntimeError(f"model {self.name!r} has no report yet: call `fit` first "
                               "(its memory and modelled step are planned at its first step)")
        return report

    # -- the three entry points ------------------------------------------------------------

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
            sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
            validation_batch_size=None, validation_freq=1, max_queue_size=10, workers=1,
            use_multiprocessing=False):
        """tf-keras' ``fit`` on the replicas (module docstring; reference §4.2-4.7).

        Returns:
            the ``History`` callback.

        Raises:
            ValueError, RuntimeError: TF-IPU's messages for the data, steps, spe and G rules.
        """
        from ipu_tensorflow import _keras_run
        self._ipu_check()
        return _keras_run.fit(self, locals())

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, max_queue_size=10, workers=1,
                 use_multiprocessing=False, return_dict=False, **kwargs):
        """tf-keras' ``evaluate`` on the replicas (reference §4.7)."""
        from ipu_tensorflow import _keras_run
        self._ipu_check()
        return _keras_run.evaluate(self, locals())

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None,
                max_queue_size=10, workers=1, use_multiprocessing=False):
        """tf-keras' ``predict`` on the replicas: rows in dataset order, the ``N % R``
        remainder batches dropped (reference §4.7)."""
        from ipu_tensorflow import _keras_run
        self._ipu_check()
        return _keras_run.predict(self, locals())

