"""``tensorflow.python.ipu.horovod.ipu_horovod_strategy`` (seed 004:2106):
:class:`collectives.framework.strategies.IPUHorovodStrategy` under TF-IPU's module path."""

from collectives.framework.strategies import IPUHorovodStrategy

IPUHorovodStrategyV1 = IPUHorovodStrategy

__all__ = ["IPUHorovodStrategy", "IPUHorovodStrategyV1"]
