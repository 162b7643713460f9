"""The hardware model: the modelled IPU-PODs, as pure functions of a system model.

:mod:`~ipu_node.hardware.chips` (the chips and IPU-Machines, every number with its source),
:mod:`~ipu_node.hardware.links` (IPU-Links, GW-Links, PCIe), :mod:`~ipu_node.hardware.systems`
(the named systems: their IPUs, links and IPU-Link domains), :mod:`~ipu_node.hardware.routing`
(routes and modelled transfer times), :mod:`~ipu_node.hardware.device_ids` (``gc-info``'s
device ids), :mod:`~ipu_node.hardware.selection` (which IPUs a request gets, and in which
order) and :mod:`~ipu_node.hardware.topology_table` (``poprun --print-topology``).

Nothing here knows what this process has attached or configured: the modules import only
each other and the leaf modules of :mod:`ipu_node` (``errors``, ``env``).
"""
