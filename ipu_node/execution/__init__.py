"""The execution model: TF-IPU's API for what runs on the replicas, eagerly on numpy.

Datasets (:mod:`~ipu_node.execution.data`, their elements in
:mod:`~ipu_node.execution.elements`), feeds (:mod:`~ipu_node.execution.ipu_infeed_queue`,
:mod:`~ipu_node.execution.ipu_outfeed_queue`), on-device loops
(:mod:`~ipu_node.execution.loops`), ``ipu_compiler.compile``
(:mod:`~ipu_node.execution.ipu_compiler`), placement scopes (:mod:`~ipu_node.execution.scopes`),
``Operation`` (:mod:`~ipu_node.execution.operation`), ``Variable``
(:mod:`~ipu_node.execution.variables`), optimizers (:mod:`~ipu_node.execution.optimizers`),
the replicas' random streams (:mod:`~ipu_node.execution.rand_ops`) and TF-IPU's ``utils``
(:mod:`~ipu_node.execution.utils`, the deprecated configuration API in ``_utils_legacy``).
Programs import these under TF-IPU's module names: ``ipu_node.loops``,
``ipu_node.ipu_infeed_queue``, ... re-export them.

Imports the device runtime (:mod:`ipu_node.runtime`) and the leaf modules of
:mod:`ipu_node`.
"""
