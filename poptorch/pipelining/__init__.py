"""Pipelining: a model cut into blocks (``BeginBlock``, ``Block``, ``BlockFunction``), the
execution strategies (``PipelinedExecution``, ``ShardedExecution``, ``Stage``), the stage plan
of a traced forward pass (``_stage_trace``) and the run of a pipelined step pass by pass in the
schedule's order (``_pipeline``). Imports the data part's batch arithmetic.
"""

__all__: list[str] = []
