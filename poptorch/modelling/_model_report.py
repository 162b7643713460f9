"""ipupod's account of a PopTorch model (an ipupod extension, not PopTorch's API): its stages,
what each IPU holds, and the modelled time of its steps.

``model.modelReport()`` gives a :class:`ModelReport`; the run report's ``poptorch`` section
holds its :meth:`~ModelReport.to_dict` for every model, and :meth:`ModelReport.card_fields`
are what :meth:`collectives.step_model.ModelCard.from_run` needs (``run=``) to price the same
model on any POD with ``what_if``. Times are modelled seconds (the real POD's), bytes are
bytes.
"""

from collectives.performance.model_report import ModelReport, StageReport

__all__ = ["ModelReport", "StageReport"]
