"""``ipu_node.utils``: TF-IPU's ``tensorflow.python.ipu.utils`` (seed 004:484-1272).

The seeds' multi-worker examples configure their IPUs with it (seed 004:2056-2058)::

    config = ipu_utils.create_ipu_config()
    config = ipu_utils.auto_select_ipus(config, num_ipus=2)
    ipu_utils.configure_ipu_system(config)
    ipu_utils.move_variable_initialization_to_cpu()

The deprecated configuration functions (``create_ipu_config``, ``auto_select_ipus``,
``select_ipus``, ``set_*_options``) build an :class:`~ipu_node.config.IPUConfig` and warn
with ``DeprecationWarning`` as the seeds mark them
(:mod:`ipu_node.execution._utils_legacy`). The rest are here: :func:`configure_ipu_system`, :func:`reset_ipu_seed` (the replicas' random streams,
:mod:`ipu_node.rand_ops`), :func:`running_on_ipu_model`,
:func:`move_variable_initialization_to_cpu`, :func:`get_num_of_ipus_in_device`,
:func:`use_synthetic_data_for`, and the enums TF-IPU's utils re-exports.
"""

from __future__ import annotations

import re
from typing import Any

from ipu_node.execution import rand_ops
from ipu_node.execution._utils_legacy import (DEPRECATION_MESSAGE, auto_select_ipus,
                                              create_ipu_config, select_ipus,
                                              set_compilation_options, set_convolution_options,
                                              set_experimental_multi_replica_distribution_options,
                                              set_floating_point_behaviour_options, set_gcl_options,
                                              set_io_tile_options, set_ipu_connection_type,
                                              set_ipu_model_options, set_matmul_options,
                                              set_norm_options, set_optimization_options,
                                              set_pooling_options, set_recomputation_options,
                                              set_report_options, set_serialization_options,
                                              set_transfer_options, set_verification_options)
from ipu_node.runtime.config import (DeviceConnectionType, ExecutionProfileType, KeyId,
                                     MergeRemoteBuffersBehaviour, SchedulingAlgorithm,
                                     SelectionOrder, SyntheticDataCategory, VerificationOptions,
                                     configure_ipu_system, get_ipu_config, reset_ipu_configuration,
                                     running_on_ipu_model)

__all__ = [
    "create_ipu_config", "auto_select_ipus", "select_ipus", "set_compilation_options",
    "set_convolution_options", "set_matmul_options", "set_pooling_options",
    "set_report_options", "set_serialization_options", "set_transfer_options",
    "set_verification_options", "set_ipu_connection_type", "set_ipu_model_options",
    "set_io_tile_options", "set_floating_point_behaviour_options", "set_gcl_options",
    "set_norm_options", "set_optimization_options", "set_recomputation_options",
    "set_experimental_multi_replica_distribution_options", "configure_ipu_system",
    "get_ipu_config", "reset_ipu_configuration", "reset_ipu_seed", "running_on_ipu_model",
    "move_variable_initialization_to_cpu", "get_num_of_ipus_in_device",
    "use_synthetic_data_for", "DEPRECATION_MESSAGE", "SelectionOrder",
    "DeviceConnectionType", "ExecutionProfileType", "MergeRemoteBuffersBehaviour",
    "SchedulingAlgorithm", "SyntheticDataCategory", "VerificationOptions", "KeyId",
]

_IPU_DEVICE = re.compile(r"^/?(?:job:[^/]+/(?:replica:\d+/)?(?:task:\d+/)?)?device:IPU:(\d+)$")


def _ordinal(ipu_device: Any, what: str) -> int:
    match = _IPU_DEVICE.match(ipu_device) if isinstance(ipu_device, str) else None
    if match is None:
        raise ValueError(f"{what}: {ipu_device!r} is not an IPU device such as "
                         "'/device:IPU:0'")
    return int(match.group(1))


def reset_ipu_seed(seed: int, device: str = "/device:IPU:0", cpu_device: str = "cpu",
                   experimental_identical_replicas: bool = False) -> None:
    """Reset the seed of the replicas' random streams (seed 004:714-729): each global replica
    ``r`` then draws from ``default_rng([seed, r])``, or every replica from
    ``default_rng([seed])`` with ``experimental_identical_replicas`` (the same streams at
    every layout; pass the same seed on every instance). Draw with
    ``ipu_node.rand_ops.generator()`` or ``rand_ops.dropout``. TF-IPU also needs the engine
    option ``target.deterministicWorkers`` for identical streams; ipupod's are deterministic
    without it.

    Raises:
        ValueError: ``device`` is not an IPU device (replicas run on ``/device:IPU:0``).
        TypeError, ValueError: ``seed`` is not an int >= 0.
    """
    if _ordinal(device, "reset_ipu_seed") != 0:
        raise ValueError(f"reset_ipu_seed: ipupod runs replicas on /device:IPU:0, not {device!r}")
    rand_ops.reset_seed(seed, experimental_identical_replicas)


def move_variable_initialization_to_cpu(graph: Any = None) -> None:
    """Move variable initialisers onto the CPU (seed 004:702-712). ipupod: nothing to move:
    Variables are initialised in host code already; accepted for the seeds' programs."""
    return None


def get_num_of_ipus_in_device(ipu_device: str, device: str = "cpu") -> int:
    """The number of IPUs of TF device ``ipu_device`` (``"/device:IPU:N"``) in the
    configured system (seed 004:689-700).

    Raises:
        ValueError: not an IPU device, or no such device in the system.
        NotConfiguredError: no system is configured.
    """
    from ipu_node.runtime.system import get_system

    ordinal = _ordinal(ipu_device, "get_num_of_ipus_in_device")
    devices = get_system().devices
    if ordinal >= len(devices):
        raise ValueError(f"get_num_of_ipus_in_device: the system has {len(devices)} IPU "
                         f"device(s), not {ipu_device!r}")
    return len(devices[ordinal].ipus)


def use_synthetic_data_for(synthetic_data_category: SyntheticDataCategory) -> bool:
    """Whether ``TF_POPLAR_FLAGS`` makes this category of data synthetic (seed
    004:1262-1272): ``--use_synthetic_data``, or the category in
    ``--synthetic_data_categories``. (ipupod accepts the flags; feeds still carry real
    data, see :data:`ipu_node.flags.FLAG_EFFECTS`.)

    Raises:
        TypeError: not a :class:`SyntheticDataCategory`.
    """
    from ipu_node.runtime.flags import poplar_flags

    if not isinstance(synthetic_data_category, SyntheticDataCategory):
        raise TypeError(f"use_synthetic_data_for needs a SyntheticDataCategory, not "
                        f"{synthetic_data_category!r}")
    values = poplar_flags().values
    if values.get("use_synthetic_data"):
        return True
    chosen = {c.strip() for c in str(values.get("synthetic_data_categories", "")).split(",")}
    return synthetic_data_category.value in chosen
