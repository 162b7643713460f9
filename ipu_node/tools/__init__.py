"""Console tools in the manner of Graphcore's ``gc-*`` command-line tools, for a modelled POD.

``gc-info`` (device listing and details), ``gc-inventory`` (every device's attributes),
``gc-links`` (IPU-Links and GW-Links), ``gc-monitor`` (which processes have which IPUs
attached), ``gc-reset`` (clears what killed jobs left), ``gc-iputraffictest`` and
``gc-hosttraffictest`` (the modelled bandwidths, with their sources), and the tools of
hardware the emulation has not got (:mod:`ipu_node.tools.gc_absent`). Each is
``main(argv=None) -> int`` and takes ``--system NAME`` (default ``$IPUPOD_SYSTEM``, else
POD16).
"""
