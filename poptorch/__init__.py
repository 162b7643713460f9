"""``import poptorch``: Graphcore's PopTorch API on CPU PyTorch, over ipupod's emulated IPUs.

A PopTorch program runs as written: the user's ``nn.Module``, autograd and optimizer do the
arithmetic; ipupod supplies what the IPU would (poptorch reference, ``shared/reference/
poptorch.md``): replicas on emulated IPUs (attached, counted in SRAM, released on detach),
PopTorch's batch arithmetic and output modes, and the gradient reduction over every replica
of the job through GCL's collectives, bit-identical at every layout of the replicas over
instances (see :mod:`poptorch._threads` for the intra-op threads that takes)::

    opts = poptorch.Options().deviceIterations(50)
    loader = poptorch.DataLoader(opts, dataset, batch_size=8, shuffle=True)
    model = poptorch.trainingModel(ModelWithLoss(net), opts,
                                   optimizer=torch.optim.SGD(net.parameters(), lr=0.05))
    for x, y in loader:
        out, loss = model(x, y)
    model.detachFromDevice()
    predictions = poptorch.inferenceModel(net)(x_test)

A model cut over the IPUs of each replica with ``BeginBlock``/``Block`` runs as a
``PipelinedExecution`` (the default) or ``ShardedExecution``, pass by pass in the schedule's
order; its FLOPs and activations are counted from the real operations, its memory per IPU is
checked at compile, and each step's modelled time is charged to the IPUs' clocks::

    poptorch.BeginBlock(net.encoder, ipu_id=0)
    poptorch.BeginBlock(net.head, ipu_id=1)
    opts.Training.gradientAccumulation(4)            # >= 2 x stages - 1
    model = poptorch.trainingModel(ModelWithLoss(net), opts)
    model(x, y)
    print(model.modelReport().table())               # stages, bubble, memory per IPU

Only this package imports torch (``import ipu_node``, ``collectives``, ``poprun``,
``popdist`` do not).
"""

from poptorch import enums, optim
from poptorch.data._async import AsynchronousDataAccessor
from poptorch.pipelining._blocks import BeginBlock, Block, BlockFunction, removeBlocks
from poptorch.data._dataloader import DataLoader
from poptorch._errors import (ConfigFileError, Error, RecoverableError, UnrecoverableError,
                              createPoptorchError)
from poptorch.execution._executor import NO_EXECUTABLE_ERR, PoplarExecutor
from poptorch._logging import logger, setLogLevel
from poptorch.modelling._model_report import ModelReport
from poptorch._ops import (MultiConv, for_loop, identity_loss, ipu_print_tensor,
                           ipuHardwareIsAvailable, ipuHardwareVersion, isRunningOnIpu, nop,
                           recomputationCheckpoint, serializedMatMul, set_available_memory,
                           set_overlap_for_input, set_overlap_for_output)
from poptorch.options._options import Options
from poptorch.options._options_groups import TensorLocationSettings
from poptorch.pipelining._strategies import PipelinedExecution, ShardedExecution, Stage
from poptorch._version import __version__
from poptorch._wrap import inferenceModel, load, trainingModel
from poptorch.enums import (AutoStage, CommGroupType, ConnectionType, DataLoaderMode, Liveness,
                            MatMulSerializationMode, MeanReductionStrategy, MultiConvPlanType,
                            OutputMode, OverlapMode, ReductionType, SharingStrategy,
                            SyncPattern, VariableRetrievalMode)

#: SDK 2.x's name of :class:`OutputMode` (removed in SDK 2.5; kept for older programs)
AnchorMode = OutputMode


__all__ = [
    "Options", "TensorLocationSettings", "DataLoader", "AsynchronousDataAccessor",
    "trainingModel", "inferenceModel", "PoplarExecutor", "NO_EXECUTABLE_ERR", "load",
    "identity_loss", "ipu_print_tensor", "nop", "recomputationCheckpoint",
    "set_available_memory", "serializedMatMul", "set_overlap_for_input",
    "set_overlap_for_output", "for_loop", "isRunningOnIpu",
    "ipuHardwareIsAvailable", "ipuHardwareVersion", "setLogLevel", "logger",
    "Error", "RecoverableError", "UnrecoverableError", "ConfigFileError",
    "createPoptorchError", "enums", "optim",
    "OutputMode", "AnchorMode", "ReductionType", "MeanReductionStrategy", "ConnectionType",
    "SyncPattern", "DataLoaderMode", "SharingStrategy", "AutoStage", "Liveness",
    "CommGroupType", "VariableRetrievalMode", "MultiConvPlanType", "OverlapMode",
    "MatMulSerializationMode", "__version__",
    # models over several IPUs
    "Block", "BeginBlock", "BlockFunction", "removeBlocks", "Stage", "PipelinedExecution",
    "ShardedExecution", "MultiConv", "ModelReport",
]
