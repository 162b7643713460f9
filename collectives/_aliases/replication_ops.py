"""``collectives.replication_ops``: TF-IPU's ``tensorflow.python.ipu.replication_ops`` (seed
004:5361-5371)."""

from collectives.ops import replication_index

__all__ = ["replication_index"]
