"""Pipelined Keras models (reference tf-keras-ipu.md §5): ``PipelineStage`` and the
stage-assignment classes (:mod:`.pipeline_stage_assignment`), the pipelining methods of the
IPU Keras extension (:mod:`.extension`), the model cut into stages (``_cut``) and one
replica's pipelined execution over ipu_node's pipeline runtime (``_run``)."""

from ipu_tensorflow.keras.pipelining.extension import PipeliningExtension, replication_factor
from ipu_tensorflow.keras.pipelining.pipeline_stage_assignment import (
    FunctionalLayerPipelineStageAssignment, FunctionalNestedModelPipelineStageAssignment,
    ModelLayerPipelineStageAssignment, ModelNestedModelPipelineStageAssignment, PipelineStage,
    SequentialLayerPipelineStageAssignment, SequentialNestedModelPipelineStageAssignment)

__all__ = ["PipelineStage", "PipeliningExtension", "replication_factor",
           "FunctionalLayerPipelineStageAssignment",
           "FunctionalNestedModelPipelineStageAssignment",
           "SequentialLayerPipelineStageAssignment",
           "SequentialNestedModelPipelineStageAssignment", "ModelLayerPipelineStageAssignment",
           "ModelNestedModelPipelineStageAssignment"]
