"""``tensorflow.keras.ipu`` (GK ``keras/ipu/__init__.py``, reference tf-keras-ipu.md §1.1):
``PipelineStage``, the pipeline-stage assignment classes, ``ReplicatedMetricReductionMethod``.
(Pipelining is owned by the TF surface work.)"""

from ipu_tensorflow._keras_options import ReplicatedMetricReductionMethod

__all__ = ["ReplicatedMetricReductionMethod"]
