"""``tensorflow.keras.ipu`` (GK ``keras/ipu/__init__.py``, reference tf-keras-ipu.md §1.1):
``PipelineStage``, the pipeline-stage assignment classes, ``ReplicatedMetricReductionMethod``.
Pipelining lives in :mod:`ipu_tensorflow.keras.pipelining`."""

from ipu_tensorflow._keras_options import ReplicatedMetricReductionMethod
from ipu_tensorflow.keras.pipelining import (FunctionalLayerPipelineStageAssignment,
                                             FunctionalNestedModelPipelineStageAssignment,
                                             ModelLayerPipelineStageAssignment,
                                             ModelNestedModelPipelineStageAssignment,
                                             PipelineStage,
                                             SequentialLayerPipelineStageAssignment,
                                             SequentialNestedModelPipelineStageAssignment)

__all__ = ["ReplicatedMetricReductionMethod", "PipelineStage",
           "FunctionalLayerPipelineStageAssignment",
           "FunctionalNestedModelPipelineStageAssignment",
           "SequentialLayerPipelineStageAssignment",
           "SequentialNestedModelPipelineStageAssignment", "ModelLayerPipelineStageAssignment",
           "ModelNestedModelPipelineStageAssignment"]
