"""``collectives.ipu_multi_worker_strategy``: TF-IPU's
``tensorflow.python.ipu.ipu_multi_worker_strategy`` (seed 004:1957-2067)."""

from collectives.framework.strategies import IPUMultiWorkerStrategy

__all__ = ["IPUMultiWorkerStrategy"]
