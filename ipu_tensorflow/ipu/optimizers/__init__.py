"""``tensorflow.python.ipu.optimizers`` (TFI ``ipu/optimizers/``): the optimizer wrappers on
TF tensors (CrossReplica, GradientAccumulationV2, MapGradient). (Owned by the TF surface
work; empty so far.)"""

__all__: list[str] = []
