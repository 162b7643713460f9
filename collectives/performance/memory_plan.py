"""A model's memory plan per IPU: the tensors each IPU of a replica keeps (parameters, buffers,
optimizer state, gradient accumulators, activations, code and exchange buffers), shared by the
front ends that model a framework's model (PopTorch: :mod:`poptorch.modelling._memory`;
TensorFlow: :mod:`ipu_tensorflow._keras_memory`). The bytes are counted in the IPUs' SRAM by
:class:`ipu_node.IPUMemory` (:mod:`ipu_node.runtime.memory`), which raises
:class:`ipu_node.IPUOutOfMemoryError` when they do not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CODE_AND_EXCHANGE_FRACTION", "KINDS", "MemoryEntry", "MemoryPlan"]

#: Share of each used IPU's memory taken by the compiled program's code, vertex state and
#: exchange buffers. ipupod assumption: no seed or anchor gives a figure; Poplar's memory
#: reports of models like BERT and ResNet show these at roughly 10-30% of tile memory, and a
#: round 10% keeps small models' figures close to their tensors while marking the cost.
CODE_AND_EXCHANGE_FRACTION = 0.10

#: The kinds of entry, in report order.
KINDS = ("parameters", "buffers", "optimizer_state", "accumulators", "activations",
         "code_and_exchange")


@dataclass(frozen=True)
class MemoryEntry:
    """One tensor (or group) of a model on an IPU: ``name``, ``nbytes``, ``kind`` (one of
    :data:`KINDS`), ``streaming`` (in Streaming Memory instead of the IPU)."""

    name: str
    nbytes: int
    kind: str
    streaming: bool = False


@dataclass
class MemoryPlan:
    """Per replica IPU index, the entries of the model there.

    Attributes:
        entries: IPU index -> entries (on chip and in Streaming Memory).
        recompute: whether training recomputes the stages' forward passes.
        assumptions: the assumptions the figures rest on (text).
    """

    entries: dict[int, list[MemoryEntry]] = field(default_factory=dict)
    recompute: bool = False
    assumptions: tuple[str, ...] = ()

    def on_chip(self, ipu: int) -> list[MemoryEntry]:
        return [e for e in self.entries.get(ipu, []) if not e.streaming]

    def total(self, ipu: int) -> int:
        """Bytes in IPU ``ipu``'s memory."""
        return sum(e.nbytes for e in self.on_chip(ipu))

    def breakdown(self, ipu: int) -> dict[str, int]:
        """Bytes per kind on IPU ``ipu`` (and ``streaming_memory``: bytes moved there)."""
        out = dict.fromkeys(KINDS, 0)
        streaming = 0
        for e in self.entries.get(ipu, []):
            if e.streaming:
                streaming += e.nbytes
            else:
                out[e.kind] += e.nbytes
        out["total"] = sum(out[k] for k in KINDS)
        out["streaming_memory"] = streaming
        return out
