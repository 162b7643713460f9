"""ipu_node: one instance's emulated IPU system.

Configuration (:class:`IPUConfig`), simulated IPUs and TF devices, replica contexts and the
executor that runs replica functions. This package imports no other ipupod package.
"""

from ipu_node.config import IPUConfig, SelectionOrder
from ipu_node.device import IPU, IPUDevice
from ipu_node.errors import (AlreadyConfiguredError, IPUConfigError, IPUError,
                             NotConfiguredError, NotInReplicaError)
from ipu_node.replica import ReplicaContext, current_replica_context, require_replica_context
from ipu_node.system import IPUSystem, get_system, reset_ipu_configuration

__all__ = [
    "IPUConfig", "SelectionOrder", "IPU", "IPUDevice", "IPUSystem", "ReplicaContext",
    "current_replica_context", "require_replica_context", "get_system",
    "reset_ipu_configuration", "IPUError", "IPUConfigError", "NotConfiguredError",
    "AlreadyConfiguredError", "NotInReplicaError",
]
