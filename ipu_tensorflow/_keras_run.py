"""``fit``, ``evaluate`` and ``predict`` of an extended Keras model on ipupod's replicas
(reference tf-keras-ipu.md §4.2-4.7; the design in :mod:`ipu_tensorflow._keras`).

The data rules and their messages (GK ``keras/ipu/extensions/data_adapter.py``,
``extensions_base.py``) are in :func:`plan_steps`; one execution of ``steps_per_execution``
steps of every local replica is one call of the strategy's replica threads per gradient
accumulation window (training) or one per execution (evaluation, prediction).
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf
from collectives import all_gather, cross_replica_mean, cross_replica_sum

from ipu_tensorflow import _bridge, _keras_memory, _keras_modelled, _replica_variables
from ipu_tensorflow._keras_options import (GradientAccumulationReductionMethod as _GA,
                                           ReplicatedMetricReductionMethod as _MR)

__all__ = ["fit", "evaluate", "predict", "plan_steps", "effective_batch_line"]

logger = logging.getLogger("tensorflow")


# -- data ------------------------------------------------------------------------------------

def _to_dataset(model, x, y, sample_weight, batch_size, shuffle):
    """``(dataset of (x, y, sample_weight) batches, batches in it or None)``.

    Raises:
        ValueError: TF-IPU's messages: a generator, a partial batch, a dataset whose shapes
            are not fully defined.
    """
    from tf_keras.src.engine import data_adapter
    if isinstance(x, tf.data.Dataset):
        dataset = x
    elif hasattr(x, "__next__") or hasattr(x, "__getitem__") and hasattr(x, "on_epoch_end"):
        raise ValueError(
            "The provided set of data is of type `generator` which is not compatible with the "
            "IPU's requirement to know the data shape ahead of time. Convert the data into a "
            "`tf.data.Dataset` with fully defined shapes instead.")
    else:
        batch_size = batch_size or 32
        arrays = (x, y, sample_weight) if sample_weight is not None else \
            ((x, y) if y is not None else (x,))
        length = len(tf.nest.flatten(x)[0])
        if length % batch_size:
            raise ValueError(
                "The provided set of data has a partial batch, which could result in data "
                "being dropped. Either adjust the `batch_size` of your model (currently set to "
                f"{batch_size}) or pad your dataset to ensure there are no partial batches.")
        dataset = tf.data.Dataset.from_tensor_slices(arrays)
        if shuffle:
            dataset = dataset.shuffle(length, reshuffle_each_iteration=True)
        dataset = dataset.batch(batch_size, drop_remainder=True)
    for spec in tf.nest.flatten(dataset.element_spec):
        if not spec.shape.is_fully_defined():
            raise ValueError(
                f"The provided set of data contains a shape {tuple(spec.shape.as_list())} "
                "which is not fully defined. Executing on IPU requires all dataset elements "
                "to have fully defined shapes. If using batch, make sure to set "
                "`drop_remainder=True`.")

    def cast(*element):
        element = element[0] if len(element) == 1 else element
        element = tf.nest.map_structure(
            lambda t: tf.cast(t, tf.float32) if t.dtype == tf.float64 else t, element)
        return data_adapter.unpack_x_y_sample_weight(element)
    dataset = dataset.map(cast)
    cardinality = int(dataset.cardinality())
    return dataset, (cardinality if cardinality >= 0 else None)


def plan_steps(num_batches, steps, spe, replicas, *, fit_epochs=None, G=1, model_name="model"):
    """``(steps per replica, steps_per_execution)`` for a call (GK ``data_adapter.py:148-193``).

    Raises:
        ValueError: unknown size without ``steps``; too little data; fewer batches than
            replicas; ``spe`` not dividing the per-replica steps.
        RuntimeError: ``G`` not dividing ``spe`` (training).
    """
    if steps is None:
        if num_batches is None:
            raise ValueError("Could not infer the size of the data. You must specify the "
                             "number of steps to run.")
        steps = num_batches
    elif num_batches is not None and steps > num_batches:
        raise ValueError("Your input does not have enough data. Make sure that your dataset "
                         "or generator can generate at least `steps_per_epoch * epochs` "
                         f"batches (in this case, {steps * (fit_epochs or 1)} batches).")
    if steps < replicas:
        raise ValueError(f"The provided dataset contains {steps} items, but all {replicas} "
                         "replicas are requested to run 1 steps each. Make sure the dataset "
                         f"contains at least {replicas} items.")
    per_replica, left = divmod(steps, replicas)
    if left and num_batches is not None:
        logger.warning("Dataset of length %d is being evenly distributed between %d replicas. "
                       "The remaining %d %s will be dropped.", num_batches, replicas, left,
                       "batches" if left > 1 else "batch")
    where = " to this replica" if replicas > 1 else ""
    if spe > per_replica:
        logger.warning("`steps_per_execution` has been set to %d but the dataset provided%s "
                       "only contains %d batches. Using %d as `steps_per_execution`.",
                       spe, where, per_replica, per_replica)
        spe = per_replica
    elif per_replica % spe:
        raise ValueError(f"`steps_per_execution` ({spe}) must be a divisor of the number of "
                         f"batches ({per_replica}) in the dataset provided{where}.")
    if fit_epochs is not None and spe % G:
        raise RuntimeError(
            "The model has been configured to use gradient accumulation for training, however "
            f"the current `steps_per_execution` value (set to {spe}) is not divisible by "
            f"`gradient_accumulation_steps_per_replica` ({G}). `steps_per_execution` must be "
            "divisible by `gradient_accumulation_steps_per_replica`.")
    return per_replica, spe


def effective_batch_line(batch, G, replicas) -> str:
    """TF-IPU's INFO line on the batch of one weight update (GK ``extensions_base.py:296-326``)."""
    accumulating = f" and accumulating {G} batches per optimizer step" if G > 1 else ""
    if replicas > 1:
        return (f"Training is distributed{accumulating} across {replicas} replicas, your "
                f"effective batch size is {batch * G * replicas}.")
    return (f"Training is not distributed{accumulating}, your effective batch size is "
            f"{batch * G}.")


# -- per-replica functions -------------------------------------------------------------------

def _clone_metrics(metrics):
    from tf_keras.src.metrics import base_metric

    def clone(m):
        if isinstance(m, base_metric.Metric):
            return type(m).from_config(m.get_config())
        return m
    if metrics is None:
        return None
    if isinstance(metrics, dict):
        return {k: _clone_metrics(v) for k, v in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return [_clone_metrics(m) if isinstance(m, (list, tuple, dict)) else clone(m)
                for m in metrics]
    return clone(metrics)


def _containers(model, r):
    """Replica r's compiled loss and metrics containers (replica 0: the model's own)."""
    fns = model.__dict__["_ipu_fns"]
    key = ("containers", r)
    if key not in fns:
        if r == 0:
            fns[key] = (model.compiled_loss, model.compiled_metrics)
        else:
            from tf_keras.src.engine import compile_utils
            args = model._ipu_options()["compile"]
            fns[key] = (
                compile_utils.LossesContainer(args["loss"], args["loss_weights"],
                                              output_names=model.output_names),
                compile_utils.MetricsContainer(_clone_metrics(args["metrics"]),
                                               _clone_metrics(args["weighted_metrics"]),
                                               output_names=model.output_names))
    return fns[key]


def _replica_fn(model, kind, r, element_spec, strategy=None, steps=1):
    """Replica r's traced function of ``kind`` (train/test/predict; train_apply: train and
    apply the gradients at once, for a job of one replica without accumulation;
    train_reduce_apply: train, sum the gradients over the job's replicas and apply them at
    once, for an instance of one replica without accumulation), traced now, in the caller's
    thread (replicas never trace a Keras model at once). The two fused kinds run ``steps``
    steps in one call, as tf-keras' ``steps_per_execution`` loop: their arguments are the
    steps' batches stacked (:func:`_stacked`)."""
    fns = model.__dict__["_ipu_fns"]
    if (kind, r) in fns:
        return fns[(kind, r)]
    loss_c, metrics_c = _containers(model, r)

    def gradients(x, y, sw, zeros=True):
        """The step's gradients (``zeros``: a variable without one gets zeros, as the
        gradients that are reduced do; else None, which the optimizer skips)."""
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = loss_c(y, y_pred, sw, regularization_losses=model.losses)
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        metrics_c.update_state(y, y_pred, sw)
        if not zeros:
            return grads
        return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads, variables)]

    def apply(grads):
        with tf.distribute.ReplicaContext(strategy, replica_id_in_sync_group=0):
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

    if kind == "train_apply":
        def fn(x, y, sw):
            apply(gradients(x, y, sw, zeros=False))
            return tf.constant(0)
    elif kind == "train_reduce_apply":
        def fn(x, y, sw):
            grads = gradients(x, y, sw)
            # the gradients' sum as one bridged op: one crossing into numpy and back per
            # step, the collective's fused buffers as the host path's (bit for bit the same)
            with _bridge.local_index_scope(tf.constant(r, tf.int32)):
                reduced = _bridge.call(lambda *g: cross_replica_sum(list(g), name="gradients"),
                                       grads, [g.dtype for g in grads],
                                       [g.shape for g in grads], "gradients")
            apply(reduced)
            return tf.constant(0)
    elif kind == "train":
        fn = gradients
    elif kind == "test":
        def fn(x, y, sw):
            y_pred = model(x, training=False)
            loss_c(y, y_pred, sw, regularization_losses=model.losses)
            metrics_c.update_state(y, y_pred, sw)
            return tf.constant(0)
    else:
        def fn(x, y, sw):
            return model(x, training=False)
    traced = tf.function(fn, autograph=True)
    if kind.startswith("train") and "train_flops" not in fns:   # (one step's)
        concrete = traced.get_concrete_function(*element_spec)
        fns["train_flops"] = _keras_modelled.graph_flops(concrete)
        fns["train_concrete"] = concrete
    if kind in ("train_apply", "train_reduce_apply"):
        step = fn

        def fn(xs, ys, sws):
            for i in tf.range(steps):   # (a tf.while_loop: one step after another)
                step(*[None if t is None else tf.nest.map_structure(lambda a: a[i], t)
                       for t in (xs, ys, sws)])
            return tf.constant(0)
        traced = tf.function(fn, autograph=True)
        element_spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec([steps] + s.shape.as_list(), s.dtype)
            if isinstance(s, tf.TensorSpec) else s, element_spec)
    traced.get_concrete_function(*element_spec)
    fns[(kind, r)] = traced
    return traced


def _stacked(batches: list) -> tuple:
    """``(x, y, sample_weight)`` batches as one, each tensor stacked over the batches
    (a new first dimension); None stays None."""
    return tuple(None if parts[0] is None else
                 tf.nest.map_structure(lambda *t: tf.stack(t), *parts)
                 for parts in zip(*batches))


def _metric_objects(model, r):
    loss_c, metrics_c = _containers(model, r)
    return list(loss_c.metrics) + list(metrics_c.metrics)


def _metric_results(model, r) -> dict:
    out = {}
    for m in _metric_objects(model, r):
        result = m.result()
        if isinstance(result, dict):
            out.update({k: np.asarray(v) for k, v in result.items()})
        else:
            out[m.name] = np.asarray(result)
    return out


def _reset_metrics(model, replicas):
    for r in range(replicas):
        for m in _metric_objects(model, r):
            m.reset_state()


def _reduced_logs(results: dict, method: _MR) -> dict:
    """In a replica thread: this replica's metric results combined over the job's replicas
    (NONE: unchanged; the host then takes the last local replica's)."""
    if method is _MR.NONE or not results:
        return results
    names = list(results)
    values = [np.asarray(results[n], np.float32) for n in names]
    if method is _MR.SUM:
        values = cross_replica_sum(values, name="replicated metrics")
    elif method is _MR.MEAN:
        values = cross_replica_mean(values, name="replicated metrics")
    else:
        values = all_gather(values, name="replicated metrics")
    return dict(zip(names, values))


def _host_logs(per_replica: list[dict], method: _MR) -> dict:
    logs = per_replica[-1]
    if method is _MR.LIST:
        return {k: v for k, v in logs.items()}
    return {k: (float(v) if np.ndim(v) == 0 else v) for k, v in logs.items()}


# -- gradient accumulation and the update --------------------------------------------------

class _Accumulator:
    """One replica's accumulated gradient over a window of G micro-batches."""

    def __init__(self, method: _GA, G: int):
        self.method, self.G, self.n, self.acc = method, G, 0, None

    def add(self, grads) -> None:
        arrays = [np.asarray(g) for g in grads]
        if self.acc is None:   # (copies only to accumulate into)
            self.acc = arrays if self.G == 1 else [a.copy() for a in arrays]
        elif self.method is _GA.RUNNING_MEAN:
            n = self.n
            self.acc = [a * a.dtype.type(n / (n + 1)) + g * g.dtype.type(1 / (n + 1))
                        for a, g in zip(self.acc, arrays)]
        else:
            for a, g in zip(self.acc, arrays):
                np.add(a, g, out=a)
        self.n += 1

    def result(self) -> list:
        if self.method is _GA.MEAN and self.G > 1:
            return [a * a.dtype.type(1 / self.G) for a in self.acc]
        return self.acc


def _apply_fn(model, strategy):
    fns = model.__dict__["_ipu_fns"]
    if "apply" not in fns:
        variables = model.trainable_variables

        @tf.function
        def apply(grads):
            model.optimizer.apply_gradients(zip(grads, variables))
        fns["apply"] = apply
    apply = fns["apply"]

    def run(grads):
        tensors = [tf.convert_to_tensor(g) for g in grads]
        tf.distribute.OneDeviceStrategy.run(strategy, apply, args=(tensors,))
        if strategy._copies_made:    # (the update went to replica 0's copies: to every one)
            _replica_variables.sync_copies(model.trainable_variables +
                                           list(model.optimizer.variables()))
    return run


# -- the calls ---------------------------------------------------------------------------------

def _verbosity(verbose):
    return 1 if verbose == "auto" else verbose


def _setup(model, x, y, sample_weight, batch_size, shuffle):
    strategy = model.distribute_strategy
    dataset, num_batches = _to_dataset(model, x, y, sample_weight, batch_size, shuffle)
    replicas = strategy.num_local_replicas
    spec = tuple(dataset.element_spec)
    if not model.built:
        with strategy.scope():
            model(next(iter(dataset))[0])
    if "_ipu_fns" not in model.__dict__:
        model._ipu_reset_functions()
    _own_state_per_replica(model)
    return strategy, dataset, num_batches, replicas, spec


def _own_state_per_replica(model) -> None:
    """Give each local replica its own copy of the model's non-trainable variables (those a
    training step writes itself, such as BatchNormalization's moving statistics), as each
    replica of the IPU holds its own: replica r's copy follows replica r's batches only, so
    the values are the same at every layout; the host reads replica 0's copy. The trainable
    variables stay one copy per instance, written once by the reduced update."""
    for variable in model.non_trainable_variables:
        if isinstance(variable, _replica_variables.ReplicaVariable):
            variable.materialize()


def _execution_batches(iterator, count):
    return [next(iterator) for _ in range(count)]


def fit(model, a: dict):
    """See :meth:`ipu_tensorflow._keras.KerasExtension.fit`."""
    from tf_keras.src import callbacks as callbacks_module
    opts = model._ipu_options()
    G, method = opts["G"], opts["ga_method"]
    pipelined = model._is_pipelined()    # (pipelined models: ipu_tensorflow.keras.pipelining)
    if pipelined:
        model._ensure_pipeline_layout()
        G, method = model._pipeline_G(), model._pipeline_reduction()
    spe0 = opts.get("spe", 1)
    if a["validation_split"]:
        raise ValueError("`validation_split` is not supported under an IPU strategy: pass "
                         "`validation_data`")
    strategy, dataset, num_batches, R, spec = _setup(model, a["x"], a["y"], a["sample_weight"],
                                                    a["batch_size"], a["shuffle"])
    per_replica, spe = plan_steps(num_batches, a["steps_per_epoch"], spe0, R,
                                  fit_epochs=a["epochs"], G=G, model_name=model.name)
    batch = int(tf.nest.flatten(spec[0])[0].shape[0])
    total_replicas = strategy.num_total_replicas
    logger.info("%s", effective_batch_line(batch, G, total_replicas))
    if spe == 1:
        logger.info("The model `%s` has been configured with only 1 steps per execution. "
                    "Consider increasing the value for the `steps_per_execution` argument "
                    "passed to the `compile()` method to improve performance.", model.name)
    # one replica in the instance, no accumulation: the update joins the step, after the
    # gradients' sum over the job's replicas when it has several (one bridged op: no
    # gradients through the host thread and a second function per step)
    fused = not pipelined and G == 1 and R == 1
    kind = ("train_apply" if total_replicas == 1 else "train_reduce_apply") if fused else \
        "train"
    train = [] if pipelined else [_replica_fn(model, kind, r, spec, strategy, spe)
                                  for r in range(R)]
    apply = _apply_fn(model, strategy)
    flops = model.__dict__["_ipu_fns"].get("train_flops", 0)
    params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    first_window = "model_facts" not in model.__dict__["_ipu_fns"]
    if not pipelined and first_window:
        _compile_memory(model, strategy, spec, flops, batch, G, spe)
    elif pipelined and first_window:
        model._pipeline_compile_memory(G)
    verbose = _verbosity(a["verbose"])
    callbacks = a["callbacks"]
    if not isinstance(callbacks, callbacks_module.CallbackList):
        callbacks = callbacks_module.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, model=model,
            verbose=verbose, epochs=a["epochs"], steps=per_replica)
    val = None
    if a["validation_data"] is not None:
        vd = a["validation_data"]
        vx, vy, vsw = (vd, None, None) if isinstance(vd, tf.data.Dataset) else \
            (tuple(vd) + (None,))[:3]
        val = (vx, vy, vsw)
    model.stop_training = False
    windows = spe // G
    callbacks.on_train_begin()
    logs = {}
    for epoch in range(a["initial_epoch"], a["epochs"]):
        _reset_metrics(model, R)
        callbacks.on_epoch_begin(epoch)
        iterator = iter(dataset)
        for execution in range(per_replica // spe):
            step = execution * spe
            callbacks.on_train_batch_begin(step)
            batches = _execution_batches(iterator, spe * R)

            def execution_steps(r):   # (fused: every step of the execution in one call)
                mine = [batches[s * R + r] for s in range(spe)]
                _bridge.call_unwrapped(r, train[r], *_stacked(mine))
                for element in mine:
                    _keras_modelled.charge_window([element], flops)
                    _keras_modelled.charge_update(params)
                return None, _reduced_logs(_metric_results(model, r), opts["metric_reduction"])

            def window(r, w):
                mine = [batches[(w * G + g) * R + r] for g in range(G)]
                if pipelined:    # the pipeline runtime charges its passes itself
                    reduced = model._pipeline_train_window(mine, *_containers(model, r))
                else:
                    acc = _Accumulator(method, G)
                    for xb, yb, swb in mine:
                        acc.add(train[r](xb, yb, swb))
                    _keras_modelled.charge_window(mine, flops)
                    reduced = cross_replica_sum(acc.result(), name="gradients")
                _keras_modelled.charge_update(params)
                results = _reduced_logs(_metric_results(model, r),
                                        opts["metric_reduction"]) if w == windows - 1 else None
                return reduced, results
            if fused:
                out = strategy.run_replicas(execution_steps)
                _keras_memory.count_steps(model, spe)
            else:
                for w in range(windows):
                    out = strategy.run_replicas(lambda r, w=w: window(r, w))
                    apply(out[0][0])
                    if pipelined and "model_facts" not in model.__dict__["_ipu_fns"]:
                        model._pipeline_record_report(batches[0], G, spe)
                    _keras_memory.count_steps(model, G)
            logs = _host_logs([o[1] for o in out], opts["metric_reduction"])
            callbacks.on_train_batch_end(step + spe - 1, logs)
            if model.stop_training:
                break
        epoch_logs = dict(logs)
        if val is not None and model._should_eval(epoch, a["validation_freq"]):
            val_logs = _evaluate_logs(model, *val, a["validation_batch_size"] or a["batch_size"],
                                      a["validation_steps"], None)
            epoch_logs.update({"val_" + k: v for k, v in val_logs.items()})
        callbacks.on_epoch_end(epoch, epoch_logs)
        if model.stop_training:
            break
    callbacks.on_train_end(logs=epoch_logs if a["epochs"] > a["initial_epoch"] else logs)
    _keras_memory.offer_card(model)
    return model.history


def _compile_memory(model, strategy, spec, train_flops, batch, G, spe) -> None:
    """At compile (the first ``fit``): the model's memory on every local replica's IPU
    (raises ``ipu_node.IPUOutOfMemoryError`` before any step when it does not fit) and the
    facts of its report (:mod:`ipu_tensorflow._keras_memory`)."""
    fns = model.__dict__["_ipu_fns"]
    forward = tf.function(lambda x: model(x, training=True)).get_concrete_function(spec[0])
    input_bytes = int(sum(np.prod(t.shape.as_list()) * t.dtype.size
                          for t in tf.nest.flatten(spec) if isinstance(t, tf.TensorSpec)))
    _keras_memory.compile_facts(model, strategy, fns["train_concrete"],
                                _keras_modelled.graph_flops(forward), train_flops, batch,
                                input_bytes, G, spe)


def _evaluate_logs(model, x, y, sample_weight, batch_size, steps, callbacks,
                   verbose=0):
    opts = model._ipu_options()
    pipelined = model._is_pipelined()
    if pipelined:
        model._ensure_pipeline_layout()
    strategy, dataset, num_batches, R, spec = _setup(model, x, y, sample_weight, batch_size,
                                                    False)
    per_replica, spe = plan_steps(num_batches, steps, opts.get("spe", 1), R,
                                  model_name=model.name)
    test = [] if pipelined else [_replica_fn(model, "test", r, spec) for r in range(R)]
    _reset_metrics(model, R)
    if callbacks is not None:
        callbacks.set_params(dict(callbacks.params, steps=per_replica))
        callbacks.on_test_begin()
    iterator = iter(dataset)
    logs = {}
    for execution in range(per_replica // spe):
        step = execution * spe
        if callbacks is not None:
            callbacks.on_test_batch_begin(step)
        batches = _execution_batches(iterator, spe * R)

        def run(r):
            if pipelined:
                model._pipeline_test_window([batches[s * R + r] for s in range(spe)],
                                            *_containers(model, r))
            for s in range(0 if pipelined else spe):
                test[r](*batches[s * R + r])
            return _reduced_logs(_metric_results(model, r), opts["metric_reduction"])
        logs = _host_logs(strategy.run_replicas(run), opts["metric_reduction"])
        if callbacks is not None:
            callbacks.on_test_batch_end(step + spe - 1, logs)
    if callbacks is not None:
        callbacks.on_test_end(logs)
    return logs


def evaluate(model, a: dict):
    """See :meth:`ipu_tensorflow._keras.KerasExtension.evaluate`."""
    from tf_keras.src import callbacks as callbacks_module
    from tf_keras.src.engine.training import flatten_metrics_in_order
    verbose = _verbosity(a["verbose"])
    callbacks = a["callbacks"]
    if not isinstance(callbacks, callbacks_module.CallbackList):
        callbacks = callbacks_module.CallbackList(callbacks, add_history=False,
                                                  add_progbar=verbose != 0, model=model,
                                                  verbose=verbose, epochs=1, steps=None)
    logs = _evaluate_logs(model, a["x"], a["y"], a["sample_weight"], a["batch_size"],
                          a["steps"], callbacks)
    if a["return_dict"]:
        return logs
    return flatten_metrics_in_order(logs, model.metrics_names)


def predict(model, a: dict):
    """See :meth:`ipu_tensorflow._keras.KerasExtension.predict`."""
    pipelined = model._is_pipelined()
    if pipelined:
        model._ensure_pipeline_layout()
    strategy, dataset, num_batches, R, spec = _setup(model, a["x"], None, None,
                                                    a["batch_size"], False)
    per_replica, spe = plan_steps(num_batches, a["steps"], model._ipu_options().get("spe", 1),
                                  R, model_name=model.name)
    fns = [] if pipelined else [_replica_fn(model, "predict", r, spec) for r in range(R)]
    iterator = iter(dataset)
    outputs = []
    for _ in range(per_replica // spe):
        batches = _execution_batches(iterator, spe * R)

        def run(r):
            if pipelined:
                return model._pipeline_predict_window([batches[s * R + r]
                                                       for s in range(spe)])
            return [tf.nest.map_structure(np.asarray, fns[r](*batches[s * R + r]))
                    for s in range(spe)]
        per = strategy.run_replicas(run)
        outputs.extend(per[r][s] for s in range(spe) for r in range(R))
    return tf.nest.map_structure(lambda *rows: np.concatenate(rows, axis=0), *outputs)

