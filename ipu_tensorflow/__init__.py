"""ipupod's TF front end: TF-IPU programs (``from tensorflow.python import ipu``) on stock
``tensorflow-cpu`` with ``tf-keras`` (the optional extra ``tensorflow``), over ipupod's
replicas, collectives, IPUs and clock (DESIGN.md, reference tf-keras-ipu.md).

The names a TF-IPU program imports are served by :mod:`ipupod_aliases` when no real TF-IPU
is installed:

* ``tensorflow.python.ipu`` is :mod:`ipu_tensorflow.ipu` (config, strategies, loops, feeds,
  ``ipu_compiler``, scopes, utils, ops, optimizers, horovod, distributed, ...);
* ``tensorflow.keras.ipu`` is :mod:`ipu_tensorflow.keras` (``PipelineStage``, ...);
* ``ipu_tensorflow_addons`` is :mod:`ipu_tensorflow.addons`;
* ``horovod.tensorflow`` is :mod:`ipu_tensorflow.horovod`.

This package is the only one of ipupod (tests aside) that imports TensorFlow; importing
``ipu_tensorflow`` itself imports nothing.
"""

__all__: list[str] = []
