"""The device runtime: this process's emulated IPU system.

Its configuration, TF-IPU's ``IPUConfig`` (:mod:`~ipu_node.runtime.config`, the option
groups in ``_config_*``) and Graphcore's environment flags (:mod:`~ipu_node.runtime.flags`);
which IPUs are attached, shared by all processes of the machine
(:mod:`~ipu_node.runtime.occupancy`, job partitions in :mod:`~ipu_node.runtime.partition`,
:mod:`~ipu_node.runtime.attach`); the configured system (:mod:`~ipu_node.runtime.system`),
its simulated IPUs and TF devices (:mod:`~ipu_node.runtime.device`), the replica contexts and
the threads that run replica functions (:mod:`~ipu_node.runtime.replica`), and the IPUs'
memory (:mod:`~ipu_node.runtime.memory`, :mod:`~ipu_node.runtime.placement`).

Imports the hardware model (:mod:`ipu_node.hardware`) and the leaf modules of
:mod:`ipu_node`; nothing of the execution model, the pipelines or the clock.
"""
