"""``ipu_node.config``: TF-IPU's ``tensorflow.python.ipu.config`` (seed 004:1276-1904).

:class:`IPUConfig` holds every option path of seed 004:1475-1904 (50 of them) with its type,
default, checks and docstring, plus ipupod's own (``ipus_per_replica``, ``system``,
``execution.compute_efficiency``, the transport fields of ``multi_replica_distribution``).
Each option's docstring says whether it acts on the emulation or is accepted with no effect,
and why (``cfg.get_attribute_metadata("io_tiles.num_io_tiles").__doc__``). The groups live in
:mod:`ipu_node.runtime._config_device` and :mod:`ipu_node.runtime._config_compile`, the
machinery in :mod:`ipu_node.runtime._config_base`, the enums in
:mod:`ipu_node.runtime._config_enums`; this module is their public face (re-exported as
``ipu_node.config``), with TF-IPU's functions :func:`configure_ipu_system`,
:func:`get_ipu_config` and :func:`reset_ipu_configuration`.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from ipu_node.hardware.systems import canonical_system_name
from ipu_node.runtime._config_base import (AttributeMetadata, ConfigAttributeError, ConfigGroup,
                                           Option, bool_option, dict_option, enum_option,
                                           str_option)
from ipu_node.runtime._config_compile import (ConvolutionsConfig, MatmulsConfig, NormsConfig,
                                              NormsExperimentalConfig, OptimizationsConfig,
                                              PoolingConfig, SchedulingConfig)
from ipu_node.runtime._config_device import (DeviceConnectionConfig, ExecutionConfig,
                                             ExperimentalConfig, FloatingPointBehaviourConfig,
                                             IOTilesConfig, IPUModelConfig,
                                             MultiReplicaDistributionConfig)
from ipu_node.runtime._config_enums import (DeviceConnectionType, ExecutionProfileType, KeyId,
                                            MergeRemoteBuffersBehaviour, SchedulingAlgorithm,
                                            SelectionOrder, StochasticRoundingBehaviour,
                                            SyntheticDataCategory, VerificationOptions)

__all__ = [
    "IPUConfig", "AttributeMetadata", "SelectionOrder", "MergeRemoteBuffersBehaviour",
    "DeviceConnectionType", "SchedulingAlgorithm", "ExecutionProfileType",
    "StochasticRoundingBehaviour", "SyntheticDataCategory", "VerificationOptions", "KeyId",
    "configure_ipu_system", "get_ipu_config",
    "reset_ipu_configuration", "running_on_ipu_model", "check_config", "ConfigAttributeError",
    # the groups (their classes; users reach them as attributes of an IPUConfig)
    "ConvolutionsConfig", "DeviceConnectionConfig", "ExperimentalConfig",
    "MultiReplicaDistributionConfig", "FloatingPointBehaviourConfig", "IOTilesConfig",
    "IPUModelConfig", "MatmulsConfig", "NormsConfig", "NormsExperimentalConfig",
    "OptimizationsConfig", "PoolingConfig", "SchedulingConfig", "ExecutionConfig",
]

_SELECTION_TYPE = "typing.Union[int, typing.List[int], typing.Tuple[int, ...]]"


def _is_int(v: Any) -> bool:
    return type(v) is int


def _selection_ok(value: Any) -> bool:
    """TF-IPU's hint: an int, or a list or tuple of ints (bools are not ints here)."""
    return _is_int(value) or (type(value) in (list, tuple) and all(map(_is_int, value)))


def _selection_explained(value: Any) -> str:
    if type(value) in (list, tuple):
        bad = next(v for v in value if not _is_int(v))
        return f"got {type(bad).__name__} {bad!r} in {list(value)!r}"
    return f"got {type(value).__name__}"


def _selection(name: str, value: Any) -> int | list[int]:
    """``auto_select_ipus``/``select_ipus``: entries >= 0; a tuple becomes a list."""
    values = [value] if _is_int(value) else list(value)
    if any(v < 0 for v in values):
        raise ValueError(f"{name} entries must be >= 0, got {value!r}")
    return value if _is_int(value) else values


def _system(name: str, value: str) -> str:
    return value if value == "" else canonical_system_name(value)


def _at_least_one(name: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _any_dict(name: str, value: dict) -> dict:
    return dict(value)


class IPUConfig(ConfigGroup):
    """Configuration of this process's emulated IPU system (seed 004:1475-1904).

    Set options by assignment, then configure::

        cfg = IPUConfig()
        cfg.auto_select_ipus = 4          # one TF device /device:IPU:0 with 4 IPUs
        cfg.configure_ipu_system()        # or ipu_node.config.configure_ipu_system(cfg)

    The groups: ``convolutions``, ``device_connection``, ``experimental`` (with
    ``multi_replica_distribution``), ``floating_point_behaviour``, ``io_tiles``,
    ``ipu_model``, ``matmuls``, ``norms`` (with ``experimental``), ``optimizations``,
    ``pooling``, ``scheduling``, and ipupod's ``execution``. ``get_attribute_metadata(path)``
    describes any option; :meth:`explicit_options` lists those a program set.

    ``ipus_per_replica`` is ipupod's own option: the model's number of shards, which the
    real stack derives from the compiled graph. When a program does not set it, ipupod
    derives it too: replicas start with one IPU each, and the first pipeline that needs more
    shards (before the layout is bound, see :meth:`IPUSystem.widen_replicas
    <ipu_node.runtime.system.IPUSystem.widen_replicas>`) gives each replica that many IPUs, so the
    replication factor is the device's IPUs over the pipeline's shards, as TF-IPU's.
    ``system`` is ipupod's own too: the emulated system (``"POD16"``, ``"C2-16"``, ...);
    ``""`` means ``$IPUPOD_SYSTEM``, else POD16.

    Raises (on assignment):
        ConfigAttributeError (AttributeError, ValueError): an option that does not exist
            ("'x' is not a valid attribute of this config. Did you mean 'y'?").
        TypeError: a value of the wrong type ("Trying to set x to v, but it must be of type
            T"), or a group assigned something other than a group of its kind.
        ValueError: a value out of range (names the option).
    """

    _options = {
        "allow_recompute": bool_option(False, (
            "Recompute forward passes in the backward pass to save memory (seed "
            "004:1476-1478). ipupod: acts: pipelines recompute each stage's forward before "
            "its backward (the same numbers; the modelled time pays the extra forward and the "
            "stash holds only stage inputs).")),
        "selection_order": enum_option(SelectionOrder.AUTO, (
            "The order IPUs map to shards on multi-IPU devices (seed 004:1480-1482). ipupod: "
            "acts: each replica's IPUs are laid out in this order "
            "(ipu_node.selection.layout_replicas).")),
        "serialization_output_folder": str_option("", (
            "Directory for serialized Poplar executables; '' disables it (seed "
            "004:1484-1486). ipupod: accepted, no effect: ipupod compiles no executable "
            "(it runs the program's numpy eagerly), so there is nothing to serialize.")),
        "compilation_poplar_options": dict_option(
            "Poplar Engine options for the session, e.g. {'debug.allowOutOfMemory': "
            "'true'} (seed 004:1488-1490). ipupod: accepted, no effect: there is no Poplar "
            "engine (run reports come from POPLAR_ENGINE_OPTIONS' autoReport or "
            "IPUPOD_REPORT_DIR; random streams are deterministic without "
            "target.deterministicWorkers)."),
        "gcl_poplar_options": Option({}, "dict", (
            "GCL options for every collective (seed 004:1492-1494). ipupod: acts: the GCL "
            "options of collectives.gcl_options ('method', ...) choose the modelled "
            "algorithm, never the result."), validate=_any_dict),
        "auto_select_ipus": Option([], _SELECTION_TYPE, (
            "IPUs of each TF device /device:IPU:N, chosen from the free ones (seed "
            "004:1496-1514): 1, [2, 2], [1, 2]. ipupod: acts: attaches free devices of those "
            "sizes, in gc-info id order."), check=_selection_ok, validate=_selection,
            explain=_selection_explained),
        "select_ipus": Option([], _SELECTION_TYPE, (
            "gc-info device ids of each TF device (seed 004:1515-1646): 0, [0, 1], [24, 25]. "
            "ipupod: acts: attaches exactly those devices."), check=_selection_ok,
            validate=_selection, explain=_selection_explained),
        "ipus_per_replica": Option(1, "int", (
            "ipupod's own: IPUs per replica (the model's shards); the local replicas are "
            "/device:IPU:0's IPUs over it. Unset, it is derived from the first pipeline (class "
            "docstring)."), validate=_at_least_one),
        "system": str_option("", (
            "ipupod's own: the emulated system ('POD16', 'C2-16', 'POD64', ...); '' means "
            "$IPUPOD_SYSTEM, else POD16."), validate=_system),
    }
    _groups = {
        "convolutions": ConvolutionsConfig,
        "device_connection": DeviceConnectionConfig,
        "experimental": ExperimentalConfig,
        "floating_point_behaviour": FloatingPointBehaviourConfig,
        "io_tiles": IOTilesConfig,
        "ipu_model": IPUModelConfig,
        "matmuls": MatmulsConfig,
        "norms": NormsConfig,
        "optimizations": OptimizationsConfig,
        "pooling": PoolingConfig,
        "scheduling": SchedulingConfig,
        "execution": ExecutionConfig,
    }

    def device_ipu_counts(self) -> Sequence[int]:
        """IPUs of each TF device ``/device:IPU:N`` that ``auto_select_ipus`` asks for."""
        sel = self.auto_select_ipus
        return [sel] if isinstance(sel, int) else list(sel)

    def configure_ipu_system(
            self, device: str = "cpu") -> "ipu_node.runtime.system.IPUSystem":  # noqa: F821
        """Attach the simulated IPUs and make this the process's IPU system (seed
        004:1898-1904; ``device``, the CPU device local to the IPUs, is accepted as TF-IPU's).

        Returns:
            The configured :class:`~ipu_node.runtime.system.IPUSystem`.

        Raises:
            IPUConfigError: the options do not describe a usable system.
            AlreadyConfiguredError: replicas of the previous system are still running.
        """
        return configure_ipu_system(self, device)


def check_config(config: IPUConfig) -> None:
    """TF-IPU's checks when a config is configured (its ``_to_protobuf``), with its messages,
    and ipupod's own.

    Raises:
        IPUConfigError: the first rule ``config`` breaks (names the options).
    """
    from ipu_node.errors import IPUConfigError
    from ipu_node.runtime.flags import poplar_flags

    mrd = config.experimental.multi_replica_distribution
    if mrd.process_count and mrd.process_index >= mrd.process_count:
        raise IPUConfigError(
            f"experimental.multi_replica_distribution.process_index must be in the range [0, "
            f"experimental.multi_replica_distribution.process_count): "
            f"multi_replica_distribution.process_index ({mrd.process_index}) must be less than "
            f"process_count ({mrd.process_count})")
    ipu_model = poplar_flags().use_ipu_model
    if ipu_model and mrd.process_count > 0:
        raise IPUConfigError("Multi-replica distribution is not supported on the IPU model. "
                             "(TF_POPLAR_FLAGS has --use_ipu_model)")
    selected = [config.select_ipus] if isinstance(config.select_ipus, int) \
        else list(config.select_ipus)
    if len(set(selected)) != len(selected):
        raise IPUConfigError("All MultiIPU indices in `select_ipus` must be unique.")
    if selected and ipu_model:
        raise IPUConfigError("When using the IPUModel, the devices to attach to can only be "
                             "specified with `auto_select_ipus`. (TF_POPLAR_FLAGS has "
                             "--use_ipu_model)")
    io = config.io_tiles
    if io.place_ops_on_io_tiles and io.num_io_tiles == 0:
        raise IPUConfigError("Cannot place ops on I/O tiles when io_tiles.num_io_tiles == 0")
    if io.num_io_tiles > 0 and \
            config.norms.experimental.distributed_batch_norm_replica_group_size > 1:
        raise IPUConfigError("norms.experimental.distributed_batch_norm_replica_group_size is "
                             "not supported with I/O tiles.")
    dc = config.device_connection
    if dc.type in (DeviceConnectionType.PRE_COMPILE, DeviceConnectionType.NEVER) \
            and not dc.version:
        raise IPUConfigError("device_connection.version must be set when "
                             "device_connection.type is DeviceConnectionType.NEVER or "
                             "DeviceConnectionType.PRE_COMPILE")
    if mrd.transport == "local" and mrd.process_count > 1:
        raise IPUConfigError(
            f"transport 'local' serves one instance, but process_count is {mrd.process_count}")
    first = config.device_ipu_counts()[:1] if not selected else []
    if first and first[0] % config.ipus_per_replica:
        raise IPUConfigError(
            f"/device:IPU:0 has {first[0]} IPUs, not a multiple of ipus_per_replica "
            f"({config.ipus_per_replica})")


def running_on_ipu_model() -> bool:
    """Whether ``TF_POPLAR_FLAGS`` has ``--use_ipu_model`` (seed 004:731-737)."""
    from ipu_node.runtime.flags import poplar_flags
    return poplar_flags().use_ipu_model


class _Runtime:
    """What the functions below call in :mod:`ipu_node.runtime.system`, installed by that module
    (it imports this one; this one never imports it, so the package has no import cycle)."""

    configure: Callable[[IPUConfig], Any] | None = None
    current: Callable[[], Any] | None = None
    reset: Callable[[], None] | None = None


def install_configure(configure: Callable[[IPUConfig], Any],
                      current: Callable[[], Any] | None = None,
                      reset: Callable[[], None] | None = None) -> None:
    """Install :mod:`ipu_node.runtime.system`'s ``configure(config)``, ``current()`` (the system or
    None) and ``reset()`` behind this module's functions (called once by that module)."""
    _Runtime.configure, _Runtime.current, _Runtime.reset = configure, current, reset


def _runtime() -> type[_Runtime]:
    if _Runtime.configure is None:  # (ipu_node/__init__ imports ipu_node.runtime.system)
        raise RuntimeError("ipu_node.runtime.system is not imported: import ipu_node first")
    return _Runtime


def configure_ipu_system(config: IPUConfig, device: str = "cpu",
                         reset_configuration: bool = True):
    """Configure the IPU system with ``config`` (seed 004:1405-1418).

    Args:
        config: an :class:`IPUConfig` (``utils.create_ipu_config()`` returns one too).
        device: the TF CPU device local to the IPUs: a string, accepted as TF-IPU's.
        reset_configuration: replace a configured system (its IPUs are freed first). False
            with a system already configured from other options raises.

    Returns:
        The :class:`~ipu_node.runtime.system.IPUSystem` (TF-IPU returns None).

    Raises:
        TypeError: ``config`` is not an IPUConfig, or ``device`` not a str.
        AlreadyConfiguredError: ``reset_configuration=False`` and another configuration is in
            place, or replicas of the current system are running.
        IPUConfigError: the options do not describe a usable system.
    """
    from ipu_node.errors import AlreadyConfiguredError

    if not isinstance(config, IPUConfig):
        raise TypeError(f"`config` must be an IPUConfig instance (or what "
                        f"utils.create_ipu_config returns), not {type(config).__name__}")
    if not isinstance(device, str):
        raise TypeError(f"`device` must be a str such as 'cpu', not {type(device).__name__}")
    rt = _runtime()
    current = rt.current() if rt.current is not None else None
    if current is not None and not reset_configuration:
        if current.config is config or current.config.same_options(config):
            return current
        raise AlreadyConfiguredError(
            "an IPU system is already configured with other options; call "
            "configure_ipu_system(config, reset_configuration=True) or "
            "reset_ipu_configuration() first")
    return rt.configure(config)


def get_ipu_config(session: Any = None) -> list[IPUConfig]:
    """The configuration of the IPU system: one copy of its :class:`IPUConfig` per TF device
    (TF-IPU: one ``IpuOptions`` per PoplarExecutor, seed 004:1420-1430). ``session`` is
    accepted (TF1) and not used.

    Raises:
        RuntimeError: "No IPU devices configured." (TF-IPU's message).
    """
    rt = _runtime()
    system = rt.current() if rt.current is not None else None
    if system is None:
        raise RuntimeError("No IPU devices configured.")
    return [copy.deepcopy(system.config) for _ in system.devices]


def reset_ipu_configuration() -> None:
    """Detach the IPUs of this process; a new configuration may follow (seed 004:1432-1436)."""
    rt = _runtime()
    if rt.reset is not None:
        rt.reset()
