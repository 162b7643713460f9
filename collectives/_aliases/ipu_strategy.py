"""``collectives.ipu_strategy``: TF-IPU's ``tensorflow.python.ipu.ipu_strategy`` (the
workshop's ``ipu.ipu_strategy.IPUStrategy()``, seed 001:1140-1236)."""

from collectives.framework.strategies import IPUStrategy

__all__ = ["IPUStrategy"]
