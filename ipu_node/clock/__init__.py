"""The modelled clock: one timeline of events per simulated IPU, in modelled seconds.

Pipelines write compute, copy, host I/O and sync events on it, collectives their
``"collective"`` events (:func:`charge_collective`); reports and traces read
:func:`timelines`. The code is in :mod:`ipu_node.clock._timelines` (its docstring says who
writes what, and how a BSP step is laid out: :func:`bsp_step`); this module is its public face.

Imports the device runtime (the configured system) and the hardware model's chips.
"""

from ipu_node.clock._timelines import (BSPStep, EVENT_KINDS, Event, Timeline, charge_collective,
                                       compute_efficiency, compute_time_s, peak_flops,
                                       efficiency_overridden,
                                       reset_timelines, timeline, timelines, bsp_step)

__all__ = ["Event", "Timeline", "EVENT_KINDS", "timeline", "timelines", "reset_timelines",
           "charge_collective", "peak_flops", "compute_time_s", "compute_efficiency",
           "efficiency_overridden", "BSPStep", "bsp_step"]
