"""``tensorflow.python.ipu.scopes``: ``ipu_scope`` and ``ipu_shard`` (TFI ``ipu/scopes.py``;
[004:74-98]): ipu_node's placement scopes, which ``ipu_compiler.compile`` reads on TF
tensors as on numpy ones (the semantics once). They change no numbers: TensorFlow computes
on the CPU; they record where TF-IPU would place the operations."""

from ipu_node.scopes import *  # noqa: F401,F403
from ipu_node.scopes import __all__  # noqa: F401
