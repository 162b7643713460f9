"""TF-IPU's module paths that the collectives serve, under the names a TF-IPU program
imports them by: ``from tensorflow.python.ipu import horovod as hvd`` becomes
``from collectives.ipu import horovod as hvd`` (:mod:`collectives.ipu.horovod`)."""

__all__ = ["horovod"]
