"""Modelling: what the model would cost on the IPUs: FLOPs and bytes counted from the real
operations (``_profile``, every leaf operation in ``_op_ledger`` for the per-operation
compute model), the modelled time of a step (``_modelled``), the memory plan per IPU
(``_memory``), ``poptorch.ModelReport`` (``_model_report``) and the run's report section
(``_report``). Imports the options and the pipelining part's stage plans.
"""

__all__: list[str] = []
