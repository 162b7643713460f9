"""launch: starting and supervising a job's instances (the launch plan, the per-instance
environment, the mpirun and local backends, the gRPC coordinator, TF_CONFIG, the bootstrap that
ends a job when one instance fails, output tagging).

PYTEST_DONT_REWRITE: the bootstrap imports this package before a program (``python -m pytest``
under poprun) starts pytest, which would otherwise warn that it cannot rewrite it (ipupod's
distribution has a ``pytest11`` plugin, so pytest marks all its packages for rewriting).
"""
