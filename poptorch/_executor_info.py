"""What a ``PoplarExecutor`` reports about itself: timings, counters, names, random state,
and its entry in the run report (a mixin of :class:`poptorch._executor.PoplarExecutor`)."""

from __future__ import annotations

import datetime

import torch

from poptorch._errors import createPoptorchError
from poptorch._report import describe_options

__all__ = ["ExecutorInfo"]


class ExecutorInfo:
    """PopTorch's reporting methods of a model (wall times of the emulation, never modelled
    IPU time: that is issue 23's clock)."""

    def _record_perf(self, t_in, t_ready, t_out, t_done, args, result) -> None:
        """Keep the time stamps of the last call (one per device iteration)."""
        di = self._layout.di
        n_in = max(1, sum(isinstance(a, torch.Tensor) for a in args))
        n_out = 1 if isinstance(result, torch.Tensor) else max(1, len(result or ()))
        for key, stamp, n in (("input", t_in, n_in), ("input_complete", t_ready, n_in),
                              ("output", t_out, n_out), ("output_complete", t_done, n_out)):
            self._perf[key] = [[stamp] * di for _ in range(n)]

    def compilationTime(self) -> datetime.timedelta:
        """Wall time the (emulated) compilation took.

        Raises:
            poptorch.Error: not compiled, or the progress bar is off.
        """
        if self._compile_time is None:
            raise createPoptorchError("Please compile the model before obtaining "
                                      "compilation time.")
        if not self._options._show_compilation_progress_bar:
            raise createPoptorchError("Please set showCompilationProgressBar option to obtain "
                                      "compilation time.")
        return self._compile_time

    def cycleCount(self) -> int:
        """PopTorch's IPU cycle count.

        Raises:
            poptorch.Error: ``logCycleCount`` is off, or (on) ipupod has no modelled cycles
                of PopTorch models yet.
        """
        if not self._options._Popart.options.get("instrumentWithHardwareCycleCounter"):
            raise createPoptorchError("Cycle count logging is disabled. Please set option "
                                      "logCycleCount to True to enable.")
        raise createPoptorchError("ipupod has no modelled cycle count of PopTorch models yet")

    def getPerfCounters(self) -> dict[str, list]:
        """Wall-clock time stamps (seconds) of the last call: per input/output tensor, one
        per device iteration."""
        return {k: [list(v) for v in vals] for k, vals in self._perf.items()}

    def _latency(self, start: str, end: str) -> tuple[float, float, float]:
        a, b = self._perf[start], self._perf[end]
        spans = [e - s for sa, sb in zip(a, b) for s, e in zip(sa, sb)]
        if not spans:
            return (0.0, 0.0, 0.0)
        return (min(spans), max(spans), sum(spans) / len(spans))

    def getHostIpuLatency(self) -> tuple[float, float, float]:
        return self._latency("input", "input_complete")

    def getComputeLatency(self) -> tuple[float, float, float]:
        return self._latency("input_complete", "output")

    def getIpuHostLatency(self) -> tuple[float, float, float]:
        return self._latency("output", "output_complete")

    def getLatency(self) -> tuple[float, float, float]:
        return self._latency("input", "output_complete")

    def getTensorNames(self) -> list[str]:
        """The names of the model's parameters and buffers."""
        return [name for name, _ in self._user_model.named_parameters()] + \
            [name for name, _ in self._user_model.named_buffers()]

    def getAnchoredTensor(self, short_name: str):
        """Raises: the emulation has no PopART graph to anchor tensors of."""
        raise createPoptorchError(f"Anchored tensor {short_name!r}: ipupod runs the model "
                                  "eagerly and has no PopART tensors to anchor")

    @property
    def rng_state(self) -> list:
        """Replica 0's random state as ``[seed, *state bytes]``."""
        if not self._rngs:
            return []
        seed = self._options.random_seed if self._options.exists("random_seed") else \
            torch.initial_seed()
        return [seed] + self._rngs[0].state.tolist()

    @rng_state.setter
    def rng_state(self, value: list) -> None:
        state = torch.tensor(value[1:], dtype=torch.uint8)
        for rng in self._rngs:
            rng.state = state.clone()

    def _describe(self) -> dict:
        device = self._device
        return {
            "name": self._name(), "training": self._training, "compiled": self._compiled,
            "attached": self._attached,
            "replicas": self._options.replication_factor,
            "global_replicas": self._options.replication_factor *
            self._options.Distributed.numProcesses,
            "ipus": [list(i) for i in device.replica_ipus] if device is not None else [],
            "sram_bytes": {str(i): m.in_use_bytes for i, m in device.memories.items()
                           if any(i in r for r in device.replica_ipus)} if device else {},
            "threads_per_replica": self._runner.threads if self._runner else None,
            "options": describe_options(self._options),
        }
