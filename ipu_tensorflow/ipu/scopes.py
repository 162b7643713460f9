"""``tensorflow.python.ipu.scopes``: ipu_node's implementation (the execution model on numpy
values, reference execution-model.md). Not yet on TF tensors and ``tf.data``
(tf-keras-ipu.md §6): a TF program gets ipu_node's objects under TF-IPU's name."""

from ipu_node.scopes import *  # noqa: F401,F403
from ipu_node.scopes import __all__  # noqa: F401
