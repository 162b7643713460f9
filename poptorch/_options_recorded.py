"""The options of :class:`poptorch.Options` that the emulation mostly records: logging,
naming, profiling and cycle counting, source locations, the execution strategy and available
memory (PT python/options.py). Each docstring says what ipupod does with it; most are
recorded in the run report (:func:`poptorch._report.describe_options`) with no effect.
"""

from __future__ import annotations

from poptorch._options_dict import OptionsDict

__all__ = ["RecordedOptions"]


class RecordedOptions(OptionsDict):
    """The base of :class:`poptorch.Options` holding these options; ``Options`` gives the
    ``_popart`` options (``_Popart``) and the attributes they set."""

    def logDir(self, log_dir: str) -> "Options":
        """Where PopTorch writes its logs. ipupod: recorded, no effect."""
        self.set(log_dir=log_dir)
        return self

    def maxRepeatLogs(self, max_lines: int | None) -> "Options":
        """Repeated log lines shown (None: all). ipupod: recorded, no effect."""
        if max_lines is not None and not isinstance(max_lines, int):
            raise AssertionError("maxRepeatLogs expects an int or None")
        self.checkIsFrozen()
        self._values["max_repeat_logs"] = max_lines
        return self

    def modelName(self, name: str) -> "Options":
        """The model's name in reports (default "training"/"inference")."""
        self.createOrSet(model_name=name)
        return self

    def enableSyntheticData(self, enabled: bool) -> "Options":
        """Random device-side inputs instead of host data. ipupod: recorded, no effect (the
        host data is used)."""
        self._Popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> "Options":
        """Count IPU cycles of the main program: ``cycleCount()`` gives the modelled cycles
        of the last call."""
        self._Popart.set("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def enableProfiling(self, profile_dir: str | None = None) -> "Options":
        """Write PopVision profiles. ipupod: the run report, trace and the poptorch report
        go to ``profile_dir`` (Poplar's ``autoReport`` engine options)."""
        engine = dict(self._popart.options.get("engineOptions", {}))
        engine.update({"debug.allowOutOfMemory": "true",
                       "autoReport.directory": profile_dir or ".", "autoReport.all": "true"})
        self._popart.setEngineOptions(engine)
        return self

    def enableStableNorm(self, enabled: bool) -> "Options":
        """Slower, more accurate norms on the IPU. ipupod: recorded, no effect."""
        self._Popart.set("enableStableNorm", enabled)
        return self

    def disableModuleNamescope(self) -> "Options":
        """Do not prefix op names with module names. ipupod: recorded, no effect."""
        self._module_namescope_enabled = False
        return self

    def setExecutionStrategy(self, strategy) -> "Options":
        """How the model's blocks map to stages and run: a ``poptorch.PipelinedExecution``
        (the default, ``AutoStage.SameAsIpu``) or ``poptorch.ShardedExecution``.

        Raises:
            AssertionError: ``strategy`` is not an execution strategy.
        """
        from poptorch._strategies import ExecutionStrategy
        if not isinstance(strategy, ExecutionStrategy):
            raise AssertionError("setExecutionStrategy expects a poptorch.PipelinedExecution "
                                 f"or poptorch.ShardedExecution, got {type(strategy).__name__}")
        self.checkIsFrozen()
        self._execution_strategy = strategy
        return self

    def setAvailableMemoryProportion(self, available_memory_proportion: dict) -> "Options":
        """Temporary memory per IPU for matmuls and convolutions, ``{"IPU0": 0.5}``.
        ipupod: recorded in the run report (the memory model does not plan temporaries).

        Raises:
            AssertionError: a key that does not start with "IPU".
        """
        actual = {}
        for key, proportion in available_memory_proportion.items():
            if not str(key).startswith("IPU"):
                raise AssertionError("Available memory proportions are expected to be in a "
                                     "dictionary of {\"IPU0\": 0.5} where the 0 in IPU is the "
                                     f"index of the IPU. Invalid key: {key}")
            actual[int(key[3:])] = proportion
        self.createOrSet(available_memory_proportion=actual)
        return self

    def showCompilationProgressBar(self, show: bool = True) -> "Options":
        """Show a bar while compiling. ipupod: nothing is compiled, no bar."""
        self._show_compilation_progress_bar = show
        return self

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> "Options":
        """Unexpected optimizer attributes log at debug instead of warning level."""
        self._relax_optimizer_checks = relax
        return self

    def sourceLocationExcludes(self, excludes: list) -> "Options":
        """Frames left out of IR source locations. ipupod: recorded, no effect."""
        self._source_location_excludes = list(excludes)
        return self

    def appendToLocationExcludes(self, *excludes: str) -> "Options":
        """Add frames left out of IR source locations. ipupod: recorded, no effect."""
        self._source_location_excludes = self._source_location_excludes + list(excludes)
        return self
