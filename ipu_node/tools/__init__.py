"""Console tools in the manner of Graphcore's ``gc-*`` command-line tools, for a modelled POD.

``gc-info`` (device listing and details), ``gc-links`` (IPU-Links and GW-Links),
``gc-monitor`` (which processes have which IPUs attached). Each is ``main(argv=None) -> int``
and takes ``--system NAME`` (default ``$IPUPOD_SYSTEM``, else POD16).
"""
