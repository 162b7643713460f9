"""Pipelining: TF-IPU's ``pipelining_ops`` over the user's numpy stages.

:mod:`~ipu_node.pipelining.pipelining_ops` is the API (``pipeline``, ``Stage``,
``last_report``; programs import it as ``ipu_node.pipelining_ops``);
:mod:`~ipu_node.pipelining.schedules` gives the schedules as per-step timelines (public: the
PopTorch front end drives the same ones). The private modules are the API's value types
(``_pipeline_types``), argument rules (``_pipeline_check``), the run pass by pass
(``_pipeline_run``), the last stage and the weight update (``_pipeline_wu``), the report of a
run (``_pipeline_report``) and ``Stage.autograd`` (``_autograd_stage``).

Imports the execution model (optimizers, Variables, loops), the device runtime, the clock and
the hardware model's routes.
"""
