"""Pipelining: TF-IPU's ``pipelining_ops`` over the user's numpy stages.

:mod:`~ipu_node.pipelining.pipelining_ops` is the API (``pipeline``, ``Stage``,
``last_report``; programs import it as ``ipu_node.pipelining_ops``);
:mod:`~ipu_node.pipelining.schedules` gives the schedules as per-step timelines,
:mod:`~ipu_node.pipelining.scheduler` runs them pass by pass through a front end's callbacks
and :mod:`~ipu_node.pipelining.pricing` prices a pipeline's modelled time (public: the one
scheduler and the one pricer of every front end, numpy, PopTorch and TF). The private modules are the API's value types
(``_pipeline_types``), argument rules (``_pipeline_check``), the run pass by pass
(``_pipeline_run``), the last stage and the weight update (``_pipeline_wu``), the report of a
run (``_pipeline_report``) and ``Stage.autograd`` (``_autograd_stage``).

Imports the execution model (optimizers, Variables, loops), the device runtime, the clock and
the hardware model's routes.
"""
