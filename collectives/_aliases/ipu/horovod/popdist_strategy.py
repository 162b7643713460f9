"""``tensorflow.python.ipu.horovod.popdist_strategy`` (TF-IPU SDK 2.x; anchors §4.1):
:class:`collectives.framework.strategies.PopDistStrategy` under TF-IPU's module path."""

from collectives.framework.strategies import PopDistStrategy

__all__ = ["PopDistStrategy"]
