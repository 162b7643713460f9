"""``Stage.autograd``: a pipeline stage whose backward pass HIPS ``autograd`` derives
(reference execution-model.md §2 (b); the optional extra ``ipupod[autodiff]``).

``fn(params, *inputs) -> outputs`` is written with ``autograd.numpy``; ``params`` is a tuple
of the values of ``variables`` in order. Only floating-point arrays are differentiated: other
inputs (integer labels) and other outputs (labels passed through) are carried unchanged and
get None gradients. ``autograd`` is imported when such a stage is made, never by
``import ipu_node``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ipu_node.execution.variables import Variable

__all__ = ["autograd_passes"]


def _is_float(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, float)) and \
        np.asarray(value).dtype.kind == "f"


def autograd_passes(fn: Callable, variables: Sequence[Variable]) -> tuple[Callable, Callable]:
    """``(forward, backward)`` of a stage computing ``fn(params, *inputs)``, the backward
    being autograd's VJP (for :meth:`Stage.autograd <ipu_node.pipelining_ops.Stage.autograd>`).

    Args:
        fn: ``fn(params, *inputs) -> outputs`` (an array, or a tuple of them) in
            ``autograd.numpy``; ``params[i]`` is ``variables[i].value``.
        variables: the Variables the stage trains.

    Raises:
        ImportError: ``autograd`` is not installed (``pip install 'ipupod[autodiff]'``).
        TypeError: ``variables`` holds something other than Variables.
    """
    try:
        from autograd import make_vjp
        from autograd.builtins import tuple as boxed_tuple
    except ImportError as exc:
        raise ImportError("Stage.autograd needs the autograd package: "
                          "pip install 'ipupod[autodiff]'") from exc
    variables = tuple(variables)
    bad = [v for v in variables if not isinstance(v, Variable)]
    if bad:
        raise TypeError(f"Stage.autograd: variables must be ipu_node.Variable, got {bad[0]!r}")

    def forward(*inputs):
        diff = [i for i, x in enumerate(inputs) if _is_float(x)]
        carried: dict = {}

        def f(args):
            params, diff_inputs = args
            full = list(inputs)
            for i, x in zip(diff, diff_inputs):
                full[i] = x
            out = fn(params, *full)
            single = not isinstance(out, (tuple, list))
            outs = (out,) if single else tuple(out)
            keep = [j for j, o in enumerate(outs) if _is_float(o) or hasattr(o, "_value")]
            carried.update(single=single, outs=outs, keep=keep)
            return boxed_tuple(tuple(outs[j] for j in keep))  # (a box autograd traces)

        params = tuple(v.value for v in variables)
        vjp, kept = make_vjp(f)((params, tuple(inputs[i] for i in diff)))
        outs = list(carried["outs"])
        for j, value in zip(carried["keep"], kept):
            outs[j] = value
        outputs = outs[0] if carried["single"] else tuple(outs)
        saved = (vjp, carried["keep"], kept, diff, len(inputs), carried["single"])
        return outputs, saved

    def backward(saved, output_grads):
        vjp, keep, kept, diff, n_inputs, single = saved
        grads = (output_grads,) if single else tuple(output_grads)
        g = tuple(np.zeros_like(k) if grads[j] is None else grads[j]
                  for j, k in zip(keep, kept))
        d_params, d_inputs = vjp(g)
        input_grads = [None] * n_inputs
        for i, d in zip(diff, d_inputs):
            input_grads[i] = d
        return dict(zip(variables, d_params)), tuple(input_grads)

    return forward, backward
