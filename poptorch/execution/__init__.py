"""Execution: ``PoplarExecutor`` (``trainingModel``/``inferenceModel``), compiling
(``_compile``) into one immutable ``Executable`` (``_executable``), the replicas on emulated
IPUs (``_device``, ``_replicas``, ``_runner``), a step per replica (``_step``), optimizers on
the device (``_device_optim``), weights, information and export as functions of the
executable (``_weights``, ``_info``, ``_export``), float16 programs computed in float32
(``_precision``).
Imports every other part.
"""

__all__: list[str] = []
