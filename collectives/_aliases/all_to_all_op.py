"""``collectives.all_to_all_op``: TF-IPU's ``tensorflow.python.ipu.all_to_all_op`` (seed
004:5036-5068)."""

from collectives.ops import all_gather, all_to_all

__all__ = ["all_gather", "all_to_all"]
