"""The performance model of the collectives: what a call, or a training step, would take on
a real IPU-POD (modelled seconds), and the reports of a run.

* :mod:`~collectives.performance.cost_model`: a collective call's modelled time on the
  POD's links (``HardwareCostModel``), from the flows of
  :mod:`~collectives.performance.link_flows` and the schedules priced by
  :mod:`~collectives.performance.pricing`;
* :mod:`~collectives.performance.step_model`: a training step's modelled time from a model
  card (:mod:`~collectives.performance.model_card`: by hand or from a run), on any POD;
* :mod:`~collectives.performance.run_report`: a run's report (JSON, Chrome trace, summary),
  and :mod:`~collectives.performance.report_cli`, ``ipupod-report``.

It imports the leaf types of ``collectives`` (its call records, GCL options) and
``ipu_node``, never the engine, the transports or the framework layer. The paths
``collectives.cost_model``, ``step_model``, ``run_report``, ``report_cli`` and ``schedules``
(this package's ``pricing``) stay.
"""
