"""PopTorch's execution strategies: which blocks form which stage, on which IPU (poptorch
reference §7.1, PT python/options.py ``Stage``, ``PipelinedExecution``, ``ShardedExecution``
and ``_DefaultStageManager``).

A *block* is named by its ``user_id`` (``poptorch.Block``, ``BeginBlock``, ``BlockFunction``;
automatic ids "0", "1", ... when None). A strategy maps each block to a :class:`Stage`:

* ``PipelinedExecution()`` / ``PipelinedExecution(AutoStage.SameAsIpu)`` (the default):
  a block's stage is its ``ipu_id`` (``AssertionError("poptorch.AutoStage.SameAsIpu was
  selected but no IPU was specified for block X")`` without one);
* ``PipelinedExecution(AutoStage.AutoIncrement)``: each new block the next stage, from 1;
* ``PipelinedExecution("A", ["B", "C"], Stage("D").ipu(3))``: stage i is the i-th argument
  (``"X associated with more than one stage"`` when a block is named twice; at compile,
  ``"Unknown Block 'X' list of expected Blocks: [...]"`` for a block not named).

A block's IPU is its stage's ``ipu()`` if set, else the block's ``ipu_id``, else its stage
id. ``ShardedExecution`` takes the same arguments and runs the stages one after another.
Operations before the first block are in stage 0 on IPU 0.
"""

from __future__ import annotations

import threading

from poptorch import enums

__all__ = ["Stage", "PipelinedExecution", "ShardedExecution", "ExecutionStrategy",
           "DEFAULT_STAGE"]

#: the stage of the operations before the first block (PopTorch numbers its automatic
#: stages from 1, stage 0 being theirs)
DEFAULT_STAGE = 0


class Stage:
    """One or more blocks running on one IPU.

    Args:
        block_ids: the ``user_id`` of each block.

    Raises:
        AssertionError: a block id that is not a string.
    """

    def __init__(self, *block_ids: str) -> None:
        if not all(isinstance(b, str) for b in block_ids):
            raise AssertionError(f"Block IDs are supposed to be strings but got {block_ids}")
        self._blocks = block_ids
        self._stage_id = -1
        self._phase_id = -1
        self._ipu: int | None = None

    @property
    def blocks(self) -> list[str]:
        """The blocks of this stage."""
        return list(self._blocks)

    def ipu(self, ipu: int) -> "Stage":
        """Run this stage on IPU ``ipu`` of the replica.

        Raises:
            AssertionError: ``ipu`` is not an int.
        """
        if not isinstance(ipu, int):
            raise AssertionError(f"Stage.ipu expects an int, got {ipu!r}")
        self._ipu = ipu
        return self

    def _setStage(self, stage: int | None) -> "Stage":
        if stage is not None:
            self._stage_id = stage
        return self

    def __repr__(self) -> str:
        ipu = f".ipu({self._ipu})" if self._ipu is not None else ""
        return f"Stage({', '.join(map(repr, self._blocks))}){ipu}"


class ExecutionStrategy:
    """Base of the execution strategies (PopTorch's ``_IExecutionStrategy``): the stage of
    each block. Thread-safe (replicas trace their forward passes at once)."""

    #: stages run one after another (sharding), not as a pipeline
    sharded = False

    def __init__(self, block_map: dict[str, Stage], auto_stage: enums.AutoStage | None):
        self._block_map = block_map
        self._auto_stage = auto_stage
        self._next_id = 1
        self._lock = threading.Lock()

    def stage(self, block_id: str) -> Stage:
        """The :class:`Stage` of ``block_id``.

        Raises:
            AssertionError: an unknown block ("Unknown block X").
        """
        if block_id not in self._block_map:
            raise AssertionError(f"Unknown block {block_id}")
        return self._block_map[block_id]

    def resolve(self, block_id: str, ipu_id: int | None) -> tuple[int, int]:
        """``(stage id, IPU)`` of block ``block_id`` begun with ``ipu_id``.

        Raises:
            AssertionError: PopTorch's errors for a block without an IPU under
                ``SameAsIpu`` and for a block no stage names.
        """
        with self._lock:
            stage = self._block_map.get(block_id)
            if stage is None:
                if self._auto_stage is None:
                    raise AssertionError(f"Unknown Block '{block_id}' list of expected Blocks: "
                                         f"{list(self._block_map.keys())}")
                stage = Stage(block_id)
                if self._auto_stage == enums.AutoStage.SameAsIpu:
                    if ipu_id is None:
                        raise AssertionError("poptorch.AutoStage.SameAsIpu was selected but no "
                                             f"IPU was specified for block {block_id}")
                    stage._setStage(ipu_id)
                else:
                    stage._setStage(self._next_id)
                    self._next_id += 1
                self._block_map[block_id] = stage
        ipu = stage._ipu if stage._ipu is not None else ipu_id
        return stage._stage_id, stage._stage_id if ipu is None else ipu

    def default_ipu(self) -> int:
        """The IPU of stage 0's operations before the first block: stage 0's ``ipu()`` when
        an explicit stage 0 sets one, else 0."""
        for stage in self._block_map.values():
            if stage._stage_id == DEFAULT_STAGE and stage._ipu is not None:
                return stage._ipu
        return 0

    def __getstate__(self) -> dict:
        # copied with the options (each executor's clone resolves its own automatic stages)
        # and saved with an exported model: everything but the lock
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        if self._auto_stage is not None:
            return f"{type(self).__name__}({self._auto_stage!r})"
        stages = sorted({id(s): s for s in self._block_map.values()}.values(),
                        key=lambda s: s._stage_id)
        return f"{type(self).__name__}({', '.join(map(repr, stages))})"


class PipelinedExecution(ExecutionStrategy):
    """Run the stages as a pipeline (PopART's pipelining: in training, ``2N - 1`` stages for
    ``N`` forward stages; ``Training.gradientAccumulation`` must be at least that, and in
    inference ``deviceIterations`` at least ``N``).

    Args:
        args: one :class:`~poptorch.AutoStage`, or the stages in order: each a block id, a
            list of block ids or a :class:`Stage`. None: ``AutoStage.SameAsIpu``.

    Raises:
        AssertionError: a block in two stages, or an argument of another type.
    """

    def __init__(self, *args) -> None:
        block_map: dict[str, Stage] = {}
        auto_stage = enums.AutoStage.SameAsIpu
        if len(args) == 1 and isinstance(args[0], enums.AutoStage):
            auto_stage = args[0]
        else:
            for stage_id, arg in enumerate(args):
                if isinstance(arg, Stage):
                    stage = arg
                elif isinstance(arg, str):
                    stage = Stage(arg)
                else:
                    if not isinstance(arg, (list, tuple)) or \
                            not all(isinstance(b, str) for b in arg):
                        raise AssertionError(f"a stage must be a block id, a list of block "
                                             f"ids or a poptorch.Stage, got {arg!r}")
                    stage = Stage(*arg)
                stage._setStage(stage_id)
                for block in stage.blocks:
                    if block in block_map:
                        raise AssertionError(f"{block} associated with more than one stage")
                    block_map[block] = stage
        super().__init__(block_map, None if block_map else auto_stage)


class ShardedExecution(PipelinedExecution):
    """Run the stages one after another, one IPU busy at a time (no rule on
    ``gradientAccumulation`` or ``deviceIterations``). Arguments as
    :class:`PipelinedExecution`."""

    sharded = True
