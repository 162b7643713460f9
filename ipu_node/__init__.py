"""ipu_node: one instance's emulated IPU system.

Configuration (:class:`IPUConfig`), the modelled POD hardware (systems, gc-info device ids,
selection orders, links, occupancy, memory), simulated IPUs and TF devices, replica contexts
and the executor that runs replica functions; the execution model's datasets, infeed and
outfeed queues, loops, ``ipu_compiler.compile`` and placement scopes (TF-IPU's module names:
``ipu_node.loops``, ``ipu_node.ipu_infeed_queue``, ...), ``Variable``, ``optimizers``,
``pipelining_ops`` and each IPU's modelled timeline (``clock``); TF-IPU's ``config`` (every
IPUConfig option, the enums, ``configure_ipu_system``, ``get_ipu_config``), ``utils`` (the
deprecated configuration API, ``reset_ipu_seed``) and ``rand_ops``; Graphcore's environment
flags (``flags``: TF_POPLAR_FLAGS, POPLAR_ENGINE_OPTIONS, POPLAR_LOG_LEVEL). This package
imports no other ipupod package.

The code is in five parts, each a subpackage that imports only the ones below it:
``hardware`` (the modelled PODs), ``runtime`` (the configuration, attached IPUs, replicas,
memory), ``execution`` (TF-IPU's execution model) and ``clock`` (each IPU's modelled
timeline) on top of it, ``pipelining`` on top of those; ``errors``, ``env``,
``transport_names`` and ``nest`` are the leaves they share, ``tools`` the ``gc-*`` commands.
The TF-IPU module names at this level (``ipu_node.loops``, ``ipu_node.config``, ...) are
aliases in one folder, ``ipu_node/_aliases/``: each re-exports the module of a part.
"""

import os as _os

# The old module paths and TF-IPU's module names are modules of one folder, ipu_node._aliases,
# found under their public paths (ipu_node.<name>) after the package's own modules.
__path__.append(_os.path.join(_os.path.dirname(__file__), "_aliases"))
del _os

from ipu_node.config import (DeviceConnectionType, ExecutionProfileType, IPUConfig,
                             MergeRemoteBuffersBehaviour, SchedulingAlgorithm, SelectionOrder)
from ipu_node.runtime.device import IPU, IPUDevice
from ipu_node.hardware.device_ids import GcDevice, gc_device, gc_devices
from ipu_node.runtime.attach import Attachment, attach_free_device
from ipu_node.env import DEFAULT_SYSTEM, IPUPOD_JOB_ID, IPUPOD_OCCUPANCY_DIR, IPUPOD_SYSTEM
from ipu_node.errors import (AlreadyConfiguredError, IPUBusyError, IPUConfigError, IPUError,
                             IPUOutOfMemoryError, NotConfiguredError, NotEnoughIPUsError,
                             NotInReplicaError, UnknownDeviceError, UnknownIPUError,
                             UnknownSystemError)
from ipu_node.errors import (FailedPreconditionError, InvalidArgumentError, NotPlacedOnIPUError,
                             OutOfRangeError)
from ipu_node.errors import DeviceNotAttachedError, IPUFloatingPointError
from ipu_node import data, ipu_compiler, ipu_infeed_queue, ipu_outfeed_queue, loops, scopes
from ipu_node.data import Dataset
from ipu_node.ipu_infeed_queue import IPUInfeedQueue
from ipu_node.ipu_outfeed_queue import IPUOutfeedMode, IPUOutfeedQueue
from ipu_node.execution.operation import Operation
from ipu_node import clock, optimizers, pipelining_ops
from ipu_node.execution.variables import Variable
from ipu_node.hardware.links import Link, LinkKind
from ipu_node.runtime.memory import IPUMemory, MemoryUsage
from ipu_node.runtime.placement import free, memory_usage, place
from ipu_node.runtime.replica import (ReplicaContext, current_replica_context,
                                      require_replica_context)
from ipu_node.hardware.routing import host_transfer_time_s, hops, route, transfer_time_s
from ipu_node.selection import assign_instance_ipus, layout_replicas, order_ipus
from ipu_node.runtime.system import IPUSystem, get_system, reset_ipu_configuration
from ipu_node.hardware.systems import SYSTEM_NAMES, SystemModel, get_system_model
from ipu_node.hardware.topology_table import format_topology_table
from ipu_node import config, flags, rand_ops, utils

__all__ = [
    "IPUConfig", "SelectionOrder", "MergeRemoteBuffersBehaviour", "IPU", "IPUDevice",
    "IPUSystem", "ReplicaContext",
    "current_replica_context", "require_replica_context", "get_system",
    "reset_ipu_configuration", "IPUError", "IPUConfigError", "NotConfiguredError",
    "AlreadyConfiguredError", "NotInReplicaError", "UnknownSystemError", "UnknownIPUError",
    "UnknownDeviceError", "NotEnoughIPUsError", "IPUBusyError", "IPUOutOfMemoryError",
    "SystemModel", "SYSTEM_NAMES", "get_system_model", "GcDevice", "gc_devices", "gc_device",
    "order_ipus", "assign_instance_ipus", "layout_replicas", "Link", "LinkKind", "route", "hops",
    "transfer_time_s", "host_transfer_time_s", "IPUMemory", "MemoryUsage", "place", "free",
    "memory_usage", "format_topology_table", "IPUPOD_SYSTEM", "IPUPOD_OCCUPANCY_DIR",
    "IPUPOD_JOB_ID", "DEFAULT_SYSTEM", "Attachment", "attach_free_device",
    # execution model (feeds, loops, compile, scopes)
    "data", "ipu_compiler", "ipu_infeed_queue", "ipu_outfeed_queue", "loops", "scopes",
    "Dataset", "IPUInfeedQueue", "IPUOutfeedQueue", "IPUOutfeedMode", "Operation",
    "InvalidArgumentError", "FailedPreconditionError", "OutOfRangeError", "NotPlacedOnIPUError",
    # execution model (Variables, optimizers, pipelining, the modelled clock)
    "Variable", "optimizers", "pipelining_ops", "clock",
    # TF-IPU's config and utils, the random streams, Graphcore's environment flags
    "config", "utils", "rand_ops", "flags", "DeviceConnectionType", "SchedulingAlgorithm",
    "ExecutionProfileType", "DeviceNotAttachedError", "IPUFloatingPointError",
]
