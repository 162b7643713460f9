"""TF stage functions on ipu_node's pipeline runtime: what ``pipelining_ops.pipeline`` runs
when its op runs (one replica, in that replica's context; reference execution-model.md §1).

Each of the user's stage functions (TF ops on TF tensors) becomes an ``ipu_node`` ``Stage``
for :func:`ipu_node.pipelining_ops.pipeline`, the one pipeline runtime of ipupod (the
schedules' closed forms, the SUM/MEAN/RUNNING_MEAN accumulation in ascending micro-batch
order from zeros, one weight update per repeat, the outfeed rules, the modelled clock and the
SRAM of each stage's IPU):

* **forward** runs the stage eagerly under a ``tf.GradientTape`` (its float inputs watched)
  and hands its outputs on as numpy (so the runtime sizes the copies between IPUs); the last
  stage of a training pipeline also calls ``optimizer_function`` on its outputs under the
  same tape. The stash the runtime accounts on the stage's IPU is the stage's inputs and
  outputs (ipupod assumption: TF does not expose the tape's intermediate tensors; a lower
  bound of the real activations).
* **backward** is ``tape.gradient`` of the stage's outputs with the gradients the next stage
  sent back (the last stage: of the loss, from ones), for the trainable variables the stage
  read and its float inputs; each ``tf.Variable`` is keyed by an ``ipu_node.Variable``
  standing for it (its bytes accounted on the stage's IPU; a variable used by stages on two
  IPUs is refused as TF-IPU refuses it).
* **variables made in a stage** are made once: a stage function that constructs
  ``keras.layers.Dense(...)`` or calls ``tf.Variable`` on every call gets the variables of
  its first call back (by creation order), as TF-IPU, which builds the stage's graph once.
  In an IPU strategy's scope (entered by the op, :mod:`.pipelining_ops`) the first replica
  to call the stage makes them, with a copy per local replica from its initial value.
* **the optimizer** is the one of the first ``OptimizerFunctionOutput`` the pipeline op
  gets (TF-IPU calls ``optimizer_function`` once, when it builds the graph); it applies the
  accumulated gradients (as TF tensors) once per repeat, so its slots live across runs.
* **FLOPs** per stage come from TensorFlow's profiler on the stage traced for its input
  shapes (:func:`ipu_tensorflow._keras_modelled.graph_flops`), counted once per shape.

So a pipelined training run computes what the same stages compute unpipelined with the same
gradient accumulation, bit for bit: the same ops per micro-batch, the chain rule cut at the
stage boundaries, the gradients summed in the same order.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from ipu_node import Variable, current_replica_context
from ipu_node.optimizers import Optimizer
from ipu_node.pipelining_ops import OptimizerFunctionOutput as _NumpyOFO, Stage
from ipu_node.pipelining_ops import pipeline as _run_pipeline

from ipu_tensorflow._keras_modelled import graph_flops

__all__ = ["StagedPipeline", "TFOptimizerFunctionOutput", "VariableProxies", "HandOver"]


class TFOptimizerFunctionOutput(_NumpyOFO):
    """What ``optimizer_function`` returns on the TF side (the public name is
    ``pipelining_ops.OptimizerFunctionOutput``; seed 004:3940-3950): ipu_node's, with a TF
    optimizer.

    Args:
        opt: a TF optimizer: a tf-keras optimizer (``tf.keras.optimizers.*``, legacy or
            not), a ``tf.compat.v1.train.Optimizer``, or an ``ipu.optimizers`` wrapper.
        loss: the loss, one of the last stage's outputs (by identity; ipupod rule, as the
            numpy pipeline's).
        compute_gradients_args, compute_gradients_kwargs: recorded (ipupod takes the
            gradients itself, from the stages' tapes).
        apply_gradients_args, apply_gradients_kwargs: passed to ``opt.apply_gradients``.
        variables: the variables to train (None: every trainable variable a stage reads).
        tape: accepted (TF-IPU's; the stages' own tapes are used).

    Raises:
        TypeError: ``opt`` has no ``apply_gradients``.
    """

    def __init__(self, opt, loss, compute_gradients_args=None, compute_gradients_kwargs=None,
                 apply_gradients_args=None, apply_gradients_kwargs=None, variables=None,
                 tape=None):
        super().__init__(opt, loss, compute_gradients_args, compute_gradients_kwargs,
                         apply_gradients_args, apply_gradients_kwargs)
        self.variables = None if variables is None else list(variables)
        self.tape = tape

    @staticmethod
    def _check_opt(opt) -> None:
        if not callable(getattr(opt, "apply_gradients", None)):
            raise TypeError("OptimizerFunctionOutput: opt must be an optimizer (with "
                            f"apply_gradients), not {type(opt).__name__}")


class VariableProxies:
    """An ``ipu_node.Variable`` standing for each ``tf.Variable`` per local replica (what the
    pipeline runtime keys gradients by; its bytes are accounted on the IPU of the stage that
    uses it), and back."""

    def __init__(self):
        self._proxies: dict = {}   # (local replica, variable ref) -> ipu_node.Variable
        self._tf_of: dict = {}     # ipu_node.Variable -> tf.Variable
        self._lock = threading.Lock()

    def proxy(self, var: tf.Variable) -> Variable:
        """The calling replica's proxy of ``var``."""
        key = (current_replica_context().local_index, var.ref())
        with self._lock:
            proxy = self._proxies.get(key)
            if proxy is None:
                proxy = Variable(np.zeros(var.shape, var.dtype.as_numpy_dtype),
                                 var.name.split(":")[0])
                self._proxies[key] = proxy
                self._tf_of[proxy] = var
        return proxy

    def variable(self, proxy: Variable) -> tf.Variable:
        """The ``tf.Variable`` ``proxy`` stands for."""
        return self._tf_of[proxy]


class HandOver(Optimizer):
    """The optimizer ipu_node's runtime applies once per repeat: hands the accumulated
    gradients (numpy, keyed by proxies) to ``owner.apply_gradients``."""

    def __init__(self, owner, name: str):
        super().__init__(name)
        self._owner = owner

    def apply_gradients(self, grads_and_vars, global_step=None, name=None) -> None:
        self._owner.apply_gradients(grads_and_vars)


def _tensor(value: Any) -> Any:
    return None if value is None else tf.convert_to_tensor(value)


def _numpy(value: Any) -> Any:
    if value is None:
        return None
    value = tf.convert_to_tensor(value)
    return value.numpy()


def _flat(structure: Any) -> list:
    return [] if structure is None else tf.nest.flatten(structure)


class _MadeOnce:
    """Variables made by a stage's code: its first call makes them, later calls get them
    back in creation order (TF-IPU builds a stage's graph once)."""

    def __init__(self):
        self._made: dict[int, list] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def scope(self, stage: int):
        made = self._made.setdefault(stage, [])
        count = [0]

        def creator(next_creator, **kwargs):
            k = count[0]
            count[0] += 1
            with self._lock:
                if k < len(made):
                    return made[k]
                with tf.init_scope():     # (a trace for FLOPs: the variable is eager)
                    variable = next_creator(**kwargs)
                made.append(variable)
                return variable

        with tf.variable_creator_scope(creator):
            yield

    def variables(self) -> list:
        return [v for stage in sorted(self._made) for v in self._made[stage]]


class _Feed:
    """An infeed for ipu_node's runtime: the replica's next element as numpy."""

    def __init__(self, take: Callable[[], Any]):
        self.next_element = take


class StagedPipeline:
    """One ``pipelining_ops.pipeline`` op: the user's stages, their variables and the
    optimizer, reused by every run of the op (every replica, every execution).

    Args:
        stages: the user's stage functions (TF tensors in, TF tensors out).
        optimizer_function: ``fn(*last_stage_outputs) -> OptimizerFunctionOutput`` or None
            (inference).
    """

    def __init__(self, stages: list, optimizer_function: Callable | None):
        self.fns = list(stages)
        self.optimizer_function = optimizer_function
        self.made = _MadeOnce()
        self.ofo: TFOptimizerFunctionOutput | None = None   # the first one: its optimizer
        self.proxies = VariableProxies()
        self._flops: dict = {}     # (stage, training, input signature) -> FLOPs
        self._local = threading.local()
        self._lock = threading.Lock()
        self._update = HandOver(self, "TFPipelineWeightUpdate")

    # -- the stages as ipu_node Stages --------------------------------------------------------

    def _call(self, s: int, args: tuple, kwargs: dict) -> Any:
        with self.made.scope(s):
            return self.fns[s](*args, **kwargs)

    def _flops_of(self, s: int, training: bool, args: tuple, kwargs: dict) -> float:
        structure = (args, kwargs)
        flat = [_tensor(v) for v in _flat(structure)]
        key = (s, training, tuple((tuple(t.shape), t.dtype.name) for t in flat))
        if key not in self._flops:
            specs = [tf.TensorSpec(t.shape, t.dtype) for t in flat]

            def body(*tensors):
                a, k = tf.nest.pack_sequence_as(structure, list(tensors))
                return self._call(s, a, k)
            self._flops[key] = float(graph_flops(
                tf.function(body, autograph=False).get_concrete_function(*specs)))
        return self._flops[key]

    def _last_ofo(self, outputs: Any) -> TFOptimizerFunctionOutput:
        """The user's ``optimizer_function`` on the last stage's outputs (under its tape);
        the first one's optimizer is the pipeline's."""
        ofo = (self.optimizer_function(**outputs) if isinstance(outputs, dict) else
               self.optimizer_function(*(outputs if isinstance(outputs, (tuple, list)) else
                                         ([] if outputs is None else [outputs]))))
        if not isinstance(ofo, TFOptimizerFunctionOutput):
            raise TypeError("optimizer_function must return a "
                            f"pipelining_ops.OptimizerFunctionOutput, not {type(ofo).__name__}")
        with self._lock:
            if self.ofo is None:
                self.ofo = ofo
        return ofo

    def stage(self, s: int, training: bool) -> Stage | Callable:
        """Stage ``s`` for ipu_node's runtime (a plain callable in inference)."""
        last = s == len(self.fns) - 1

        def flops(*args, **kwargs):
            return self._flops_of(s, training, args, kwargs)

        if not training:
            def infer(*args, **kwargs):
                args, kwargs = tf.nest.map_structure(_tensor, (args, kwargs))
                return tf.nest.map_structure(_numpy, self._call(s, args, kwargs))
            infer.flops = flops   # (the runtime reads a stage's ``flops``)
            return infer

        def forward(*args, **kwargs):
            args, kwargs = tf.nest.map_structure(_tensor, (args, kwargs))
            inputs = _flat((args, kwargs))   # (None where the previous stage gave None)
            loss = None
            with tf.GradientTape() as tape:
                tape.watch([t for t in inputs if t is not None and t.dtype.is_floating])
                outputs = self._call(s, args, kwargs)
                if last:
                    loss = self._last_ofo(outputs).loss
            flat_out = [None if t is None else tf.convert_to_tensor(t) for t in _flat(outputs)]
            held = [t.numpy() for t in inputs + flat_out if t is not None]
            numpy_out = tf.nest.map_structure(_numpy, outputs)
            if last:   # (the runtime finds the loss among the outputs by identity)
                self._local.loss = next(
                    (n for t, n in zip(_flat(outputs), _flat(numpy_out)) if t is loss), loss)
            return numpy_out, (tape, inputs, flat_out, loss, held)

        def backward(saved, output_grads):
            tape, inputs, flat_out, loss, _ = saved
            if loss is not None:
                pairs = [(tf.convert_to_tensor(loss), tf.ones_like(loss))]
            else:
                pairs = [(t, tf.convert_to_tensor(g)) for t, g in
                         zip(flat_out, output_grads or []) if t is not None and g is not None
                         and t.dtype.is_floating]
            if not pairs:
                return {}, [None] * len(inputs)
            chosen = None if self.ofo is None else self.ofo.variables
            variables = [v for v in tape.watched_variables() if v.trainable and (
                chosen is None or any(v is c for c in chosen))]
            floats = [i for i, t in enumerate(inputs) if t is not None and t.dtype.is_floating]
            grads = tape.gradient([t for t, _ in pairs], variables + [inputs[i] for i in floats],
                                  output_gradients=[g for _, g in pairs])
            var_grads = {self.proxies.proxy(v): tf.convert_to_tensor(g).numpy()
                         for v, g in zip(variables, grads) if g is not None}
            in_grads: list = [None] * len(inputs)
            for i, g in zip(floats, grads[len(variables):]):
                in_grads[i] = None if g is None else tf.convert_to_tensor(g).numpy()
            return var_grads, in_grads

        return Stage(forward, backward, flops=flops, name=getattr(self.fns[s], "__name__",
                                                                  None))

    # -- the weight update ---------------------------------------------------------------------

    def _runtime_ofo(self, *values, **named):
        """What ipu_node's runtime calls on the last stage's (numpy) outputs: the loss the
        user's ``optimizer_function`` chose in the forward pass (the runtime refuses one
        that is not among the outputs, with its message)."""
        return _NumpyOFO(self._update, self._local.loss)

    def apply_gradients(self, grads_and_vars) -> None:
        """The accumulated gradients (numpy, keyed by proxies) applied by the optimizer of
        the first ``OptimizerFunctionOutput`` (with its ``apply_gradients`` arguments), in
        the calling replica to its copies. The optimizer's slots are made first, by one
        replica at a time (several local replicas apply at once; the slots, made in the
        strategy's scope, have a copy per replica as the variables do).

        Raises:
            ValueError: the optimizer accumulates gradients itself (TF-IPU refuses a
                gradient accumulation optimizer in a pipeline).
        """
        from ipu_tensorflow.ipu.optimizers.gradient_accumulation_optimizer import (
            GradientAccumulationOptimizerV2)
        from ipu_tensorflow.ipu.optimizers.ipu_optimizer import create_slots

        ofo = self.ofo
        if isinstance(ofo.opt, GradientAccumulationOptimizerV2):
            raise ValueError(
                f"{type(ofo.opt).__name__} cannot be used in a pipeline: the pipeline "
                "accumulates the gradients itself (gradient_accumulation_count) "
                "[reference §1.4, DOC:452-454]")
        pairs = [(tf.convert_to_tensor(g), self.proxies.variable(v)) for g, v in grads_and_vars
                 if g is not None]
        with self._lock:   # (the replicas apply at once: the slots are made once, here)
            create_slots(ofo.opt, [v for _, v in pairs])
        ofo.opt.apply_gradients(pairs, *ofo.apply_gradients_args,
                                **ofo.apply_gradients_kwargs)

    # -- one run -----------------------------------------------------------------------------

    def run(self, inputs: list, infeed: Callable[[], Any] | None, outfeed, options: dict):
        """Run the pipeline now in the calling replica (ipu_node's runtime), with
        ``inputs`` (eager tensors) before the infeed element in stage 0's arguments.

        With several local replicas each runs its own pipeline at once, on its own copies
        of the variables (:mod:`ipu_tensorflow._replica_variables`): its stages read them and
        its weight update writes them, with its own accumulated gradients unless the
        optimizer reduces them across replicas (``CrossReplicaOptimizer``, as TF-IPU).
        """
        training = self.optimizer_function is not None
        stages = [self.stage(s, training) for s in range(len(self.fns))]
        _run_pipeline(stages, inputs=list(tf.nest.map_structure(_numpy, inputs)),
                      infeed_queue=None if infeed is None else _Feed(infeed),
                      outfeed_queue=outfeed,
                      optimizer_function=self._runtime_ofo if training else None, **options)
