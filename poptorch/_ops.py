"""PopTorch's operations that programs call inside models (poptorch reference §9, §5.3).
Outside the IPU they compute what PopTorch's CPU kernels compute."""

from __future__ import annotations

import numpy as np
import torch

from poptorch import enums
from poptorch.pipelining._blocks import current_forward
from poptorch._tracing import record_identity_loss

__all__ = ["identity_loss", "ipu_print_tensor", "nop", "recomputationCheckpoint",
           "set_available_memory", "serializedMatMul", "set_overlap_for_input",
           "set_overlap_for_output", "for_loop", "isRunningOnIpu",
           "ipuHardwareIsAvailable", "ipuHardwareVersion", "MultiConv"]


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` reduced by ``reduction`` ("sum", "mean" or "none") as the model's loss:
    backward starts from it with a gradient of ones.

    Raises:
        AssertionError: another reduction ("Unsupported reduction type!").
    """
    if reduction == "sum":
        loss = torch.sum(x)
    elif reduction == "mean":
        loss = torch.mean(x)
    elif reduction == "none":
        loss = x.clone()
    else:
        raise AssertionError("Unsupported reduction type!")
    record_identity_loss(loss)
    return loss


def ipu_print_tensor(tensor: torch.Tensor, title: str = "", print_gradient: bool = True,
                     summarise_threshold: int = 1000, edge_items: int = 3,
                     max_line_width: int = 80, digits: int = 4, float_format: str = "auto",
                     separator: str = ", ", open_bracket: str = "(",
                     close_bracket: str = ")") -> torch.Tensor:
    """Print ``tensor`` (and, in the backward pass, its gradient under ``title +
    "_gradient"``) every time it is computed; returns it (use the result).

    Raises:
        TypeError: ``tensor`` is not a tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"ipu_print_tensor expects a torch.Tensor, got {type(tensor).__name__}")

    def show(t: torch.Tensor, name: str) -> None:
        values = t.detach()
        if values.is_floating_point() and values.dtype not in (torch.float32, torch.float64):
            values = values.float()
        body = np.array2string(values.cpu().numpy(), max_line_width=max_line_width,
                               precision=digits, separator=separator,
                               threshold=summarise_threshold, edgeitems=edge_items)
        if body.startswith("[") and body.endswith("]"):
            body = open_bracket + body[1:-1] + close_bracket
        print(f"{name}: {body}" if name else body, flush=True)

    show(tensor, title)
    if print_gradient and tensor.requires_grad:
        tensor.register_hook(lambda g: show(g, f"{title}_gradient"))
    return tensor


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """The identity, never optimised away on the IPU."""
    return tensor


def recomputationCheckpoint(*tensors: torch.Tensor):
    """Keep ``tensors`` for the backward pass instead of recomputing them (when the model
    recomputes: a pipeline over several IPUs, or PopART's ``autoRecomputation``); returns
    the tensors (one tensor alone). The memory model stashes them and recomputes the rest
    of their stage piece by piece (:mod:`poptorch.modelling._memory`). A tuple or list argument
    counts
    as its tensors."""
    if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
        tensors = tuple(tensors[0])
    forward = current_forward()
    if forward is not None:
        forward.checkpoint(tensors)
    return tensors[0] if len(tensors) == 1 else tensors


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float = 0.6
                         ) -> torch.Tensor:
    """Temporary memory of the op producing ``tensor`` (a proportion of the tile memory);
    returns it. ipupod: recorded per stage in the model's report."""
    _note("available_memory_proportion", float(available_memory_proportion))
    return tensor


def serializedMatMul(lhs: torch.Tensor, rhs: torch.Tensor,
                     mode: enums.MatMulSerializationMode, factor: int = 0,
                     keep_precision: bool = False) -> torch.Tensor:
    """``lhs @ rhs`` computed in ``factor`` pieces on the IPU. ipupod: ``torch.matmul``
    (the same numbers as PopTorch's CPU path); the serialisation has no effect on the
    modelled time or memory and is recorded in the stage's notes of the model's report.

    Raises:
        AssertionError: ``mode`` is not a ``poptorch.MatMulSerializationMode``.
    """
    if not isinstance(mode, enums.MatMulSerializationMode):
        raise AssertionError("serializedMatMul expects a poptorch.MatMulSerializationMode")
    _note("serialized_matmul", f"{mode.name} x{factor}")
    return torch.matmul(lhs, rhs)


def set_overlap_for_input(input_tensors, mode: enums.OverlapMode):
    """Let the host-to-IPU copy of ``input_tensors`` (a tensor or a nest of them) overlap
    compute through IO tiles; returns them. ipupod: no effect (the modelled step does not
    overlap host I/O, :mod:`poptorch.modelling._modelled`), recorded in the stage's notes of
    the model's report.

    Raises:
        AssertionError: ``mode`` is not a ``poptorch.OverlapMode``.
    """
    return _overlap("overlap_for_input", input_tensors, mode)


def set_overlap_for_output(output_tensors, mode: enums.OverlapMode):
    """The same as :func:`set_overlap_for_input` for the IPU-to-host copy of outputs."""
    return _overlap("overlap_for_output", output_tensors, mode)


def _overlap(kind: str, tensors, mode: enums.OverlapMode):
    if not isinstance(mode, enums.OverlapMode):
        raise AssertionError(f"set_{kind} expects a poptorch.OverlapMode")
    _note(kind, mode.name)
    return tensors


def _note(kind: str, value) -> None:
    forward = current_forward()
    if forward is not None:
        forward.note(kind, value)


def for_loop(count: int, body, inputs: list) -> list:
    """Run ``body`` ``count`` times, each iteration's outputs the next one's inputs.

    Raises:
        ValueError: ``inputs`` is not a list of tensors.
    """
    if not isinstance(inputs, list) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ValueError("poptorch.for_loop expects input tensors (inputs) to be a list of "
                         "tensors. (Object contained in list cannot be passed as a tensor)")
    for _ in range(count):
        out = body(*inputs)
        inputs = list(out) if isinstance(out, (list, tuple)) else [out]
    return inputs


def isRunningOnIpu() -> bool:
    """False: ipupod runs models eagerly on the CPU (PopTorch is True only while tracing)."""
    return False


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """False: the IPUs are emulated (no physical IPU hardware)."""
    return False


def ipuHardwareVersion() -> int:
    """Raises: no IPU hardware on this system (the IPUs are emulated).

    Raises:
        AssertionError: "No IPU hardware available on this system".
    """
    raise AssertionError("No IPU hardware available on this system")


class MultiConv:
    """A context manager: the convolutions inside run as one multi-convolution on the IPU.
    The builder methods set its options (each a value for all convolutions or a list, one per
    convolution). ipupod: no effect on the numbers; the convolutions and options are recorded
    per stage in the model's report.

    Raises:
        AssertionError: an option of the wrong type.
    """

    def __init__(self) -> None:
        self._options: dict = {}

    def _set(self, name: str, value, kind) -> "MultiConv":
        values = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(v, kind) for v in values):
            raise AssertionError(f"MultiConv.{name} expects {kind} or a list of them, "
                                 f"got {value!r}")
        self._options[name] = value
        return self

    def availableMemoryProportions(self, value) -> "MultiConv":
        return self._set("availableMemoryProportions", value, (int, float))

    def partialsTypes(self, value) -> "MultiConv":
        return self._set("partialsTypes", value, torch.dtype)

    def enableConvDithering(self, value) -> "MultiConv":
        return self._set("enableConvDithering", value, bool)

    def planType(self, value: enums.MultiConvPlanType) -> "MultiConv":
        return self._set("planType", value, enums.MultiConvPlanType)

    def perConvReservedTiles(self, value: int) -> "MultiConv":
        return self._set("perConvReservedTiles", value, int)

    def cycleBackOff(self, value: float) -> "MultiConv":
        return self._set("cycleBackOff", value, (int, float))

    def __enter__(self) -> "MultiConv":
        forward = current_forward()
        if forward is not None:
            forward.note("multi_conv", dict(self._options))
        return self

    def __exit__(self, *exc) -> None:
        return None
