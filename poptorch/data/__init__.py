"""Data: ``poptorch.DataLoader``, ``AsynchronousDataAccessor`` and PopTorch's batch arithmetic
(the combined batch, the input split into micro-batches, the outputs per ``OutputMode``).

Private modules: ``_dataloader``, ``_async``, ``_batching``. Imports the options.
"""

__all__: list[str] = []
