"""``ipu_tensorflow_addons.keras.optimizers``: the IPU Keras optimizers (reference
tf-keras-ipu.md §7) as ``tf.keras.optimizers.legacy`` (``OptimizerV2``) optimizers, the base
class the add-on's optimizers have (``_resource_apply_dense``, ``add_slot``, ``get_slot``).

========================= =============================================================
add-on optimizer          closest tf-keras 2.21
========================= =============================================================
AdamIpuOptimizer          ``tf.keras.optimizers.Adam(adaptive_epsilon=True)``
LAMBIpuOptimizer          none (LAMB, written here)
SGDIpuOptimizer           ``tf.keras.optimizers.legacy.SGD`` (equal in fp32)
IpuOptimizerBase          ``tf.keras.optimizers.legacy.Optimizer``
========================= =============================================================
"""

from ipu_tensorflow.addons.keras.optimizers.ipu_optimizer_base import IpuOptimizerBase
from ipu_tensorflow.addons.keras.optimizers.adam_optimizer import AdamIpuOptimizer
from ipu_tensorflow.addons.keras.optimizers.lamb_optimizer import LAMBIpuOptimizer
from ipu_tensorflow.addons.keras.optimizers.sgd_optimizer import SGDIpuOptimizer

__all__ = ["IpuOptimizerBase", "AdamIpuOptimizer", "LAMBIpuOptimizer", "SGDIpuOptimizer"]
