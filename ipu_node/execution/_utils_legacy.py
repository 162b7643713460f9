"""The deprecated ``tensorflow.python.ipu.utils`` configuration API (seed 004:484-1260),
mapped onto :class:`ipu_node.config.IPUConfig` (re-exported by :mod:`ipu_node.utils`).

``create_ipu_config()`` returns an :class:`IPUConfig` (TF-IPU: an ``IpuOptions`` protobuf);
each ``set_*_options(opts, ...)`` sets the matching options and returns ``opts``;
``utils.configure_ipu_system(opts)`` configures it. Every function the seeds mark deprecated
warns with ``DeprecationWarning`` and the seeds' text. Options of the old API with no
``IPUConfig`` field: ``profiling`` with ``report_directory`` becomes the engine options
``autoReport.all``/``autoReport.directory`` in ``compilation_poplar_options`` (where SDK 2.1
moved profiling: the run report and trace are written there); the report, transfer and
verification options are checked and have no effect (nothing to report or verify).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from ipu_node.runtime._config_enums import (DeviceConnectionType, ExecutionProfileType,
                                            MergeRemoteBuffersBehaviour, SchedulingAlgorithm,
                                            SelectionOrder, StochasticRoundingBehaviour,
                                            VerificationOptions)
from ipu_node.runtime.config import IPUConfig

__all__ = ["DEPRECATION_MESSAGE", "create_ipu_config", "auto_select_ipus", "select_ipus",
           "set_compilation_options", "set_convolution_options", "set_matmul_options",
           "set_pooling_options", "set_report_options", "set_serialization_options",
           "set_transfer_options", "set_verification_options", "set_ipu_connection_type",
           "set_ipu_model_options", "set_io_tile_options",
           "set_floating_point_behaviour_options", "set_gcl_options", "set_norm_options",
           "set_optimization_options", "set_recomputation_options",
           "set_experimental_multi_replica_distribution_options"]

#: The seeds' deprecation text (seed 004:488).
DEPRECATION_MESSAGE = (
    "THIS FUNCTION IS DEPRECATED. It will be removed in a future version. Instructions for "
    "updating: Configuring IPU session options for TensorFlow has changed and this function "
    "will be removed in a future release. Use an IPUConfig instance instead. For more "
    "information on how to create an equivalent config in the new IPUConfig API, refer to "
    "the API changes for SDK 2.1 in the TensorFlow documentation.")


def _deprecated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        warnings.warn(f"{fn.__name__} (from ipu_node.utils) is deprecated: "
                      f"{DEPRECATION_MESSAGE}", DeprecationWarning, stacklevel=2)
        return fn(*args, **kwargs)
    return wrapper


def _opts(opts: Any, fn: str) -> IPUConfig:
    if not isinstance(opts, IPUConfig):
        raise TypeError(f"{fn}: opts must be the configuration create_ipu_config() returns "
                        f"(an IPUConfig), not {type(opts).__name__}")
    return opts


def _dict(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"`{what}` must be a dictionary")
    return value


def _set_if_changed(cfg: IPUConfig, path: str, value: Any) -> None:
    """Assign ``value`` to option ``path`` unless it equals the current value (so that the
    run report lists only what the program changed)."""
    *groups, name = path.split(".")
    target = cfg
    for g in groups:
        target = getattr(target, g)
    if getattr(target, name) != value or type(getattr(target, name)) is not type(value):
        setattr(target, name, value)


@_deprecated
def create_ipu_config(profiling=False, enable_ipu_events=False, use_poplar_text_report=False,
                      use_poplar_cbor_report=False, profile_execution=None,
                      enable_poplar_serialized_graph=False, report_every_nth_execution=0,
                      max_report_size=268435456, report_directory="",
                      scheduler_selection=SchedulingAlgorithm.CHOOSE_BEST,
                      always_rearrange_copies_on_the_host=False, merge_infeed_io_copies=False,
                      disable_graph_outlining=False, retain_control_dependencies=False,
                      max_cross_replica_sum_buffer_size=0, max_inter_ipu_copies_buffer_size=0,
                      max_scheduler_lookahead_depth=5, max_scheduler_search_space_size=64,
                      prefetch_data_streams=True, selection_order=SelectionOrder.AUTO,
                      enable_experimental_remote_buffer_embedding=False) -> IPUConfig:
    """A new :class:`IPUConfig` with these options (seed 004:524-575; the module docstring
    says where the profiling arguments go).

    Raises:
        ValueError: ``profiling`` and ``enable_ipu_events`` together, or
            ``profile_execution`` without ``profiling`` (TF-IPU's messages).
        TypeError: ``profile_execution`` of another type; a wrong option type.
    """
    if profiling and enable_ipu_events:
        raise ValueError("`profiling` and `enable_ipu_events` are mutually exclusive")
    if isinstance(profile_execution, bool) or profile_execution is None:
        profile_execution = ExecutionProfileType.DEVICE_PROFILE if profile_execution \
            else ExecutionProfileType.NO_PROFILE
    if not isinstance(profile_execution, ExecutionProfileType):
        raise TypeError("`profile_execution` must be True, False, or an ExecutionProfileType "
                        "instance")
    if profile_execution is not ExecutionProfileType.NO_PROFILE and not profiling:
        raise ValueError("`profiling` is required when `profile_execution` is set")
    cfg = IPUConfig()
    if profiling:
        cfg.compilation_poplar_options = {"autoReport.all": "true",
                                          "autoReport.directory": report_directory or "."}
    for path, value in (
            ("scheduling.algorithm", scheduler_selection or SchedulingAlgorithm.CHOOSE_BEST),
            ("experimental.always_rearrange_copies_on_the_host",
             always_rearrange_copies_on_the_host),
            ("optimizations.merge_infeed_io_copies", merge_infeed_io_copies),
            ("optimizations.enable_graph_outlining", not disable_graph_outlining),
            ("optimizations.maximum_cross_replica_sum_buffer_size",
             max_cross_replica_sum_buffer_size),
            ("optimizations.maximum_inter_ipu_copies_buffer_size",
             max_inter_ipu_copies_buffer_size),
            ("scheduling.maximum_scheduler_lookahead_depth", max_scheduler_lookahead_depth),
            ("scheduling.maximum_scheduler_search_space_size", max_scheduler_search_space_size),
            ("optimizations.prefetch_data_streams", prefetch_data_streams),
            ("selection_order", selection_order or SelectionOrder.AUTO),
            ("experimental.enable_remote_buffer_embedding",
             enable_experimental_remote_buffer_embedding),
            # the old API's default where IPUConfig's differs (seed 004:1100)
            ("optimizations.merge_remote_buffers", MergeRemoteBuffersBehaviour.NO_MERGING)):
        _set_if_changed(cfg, path, value)
    return cfg


@_deprecated
def auto_select_ipus(opts: IPUConfig, num_ipus) -> IPUConfig:
    """``opts.auto_select_ipus = num_ipus`` (seed 004:484-522).

    Raises:
        ValueError: IPUs were already chosen ("IPU devices have already been configured.").
        TypeError: ``num_ipus`` is not an int, list or tuple.
    """
    cfg = _opts(opts, "auto_select_ipus")
    if cfg.auto_select_ipus not in ([], ()) or cfg.select_ipus not in ([], ()):
        raise ValueError("IPU devices have already been configured.")
    if type(num_ipus) not in (int, list, tuple):
        raise TypeError("`num_ipus` must be an integer, list or tuple.")
    cfg.auto_select_ipus = num_ipus
    return cfg


@_deprecated
def select_ipus(opts: IPUConfig, indices) -> IPUConfig:
    """``opts.select_ipus = indices`` (seed 004:739-894).

    Raises:
        ValueError: IPUs already chosen, or repeated indices (TF-IPU's messages).
        TypeError: ``indices`` is not a list or tuple.
    """
    cfg = _opts(opts, "select_ipus")
    if cfg.auto_select_ipus not in ([], ()) or cfg.select_ipus not in ([], ()):
        raise ValueError("IPU devices have already been configured.")
    if not isinstance(indices, (list, tuple)):
        raise TypeError("`indices` must be a list or tuple.")
    if len(set(indices)) != len(indices):
        raise ValueError("All device indices in `indices` must be unique.")
    cfg.select_ipus = list(indices)
    return cfg


def _poplar_setter(attr: str, what: str):
    """A ``set_X_options(opts, X_options=None)`` that adds to ``opts.<attr>``."""
    def setter(opts: IPUConfig, options: dict | None = None) -> IPUConfig:
        cfg = _opts(opts, f"set_{what}_options")
        group, _, name = attr.rpartition(".")
        target = getattr(cfg, group) if group else cfg
        merged = {**getattr(target, name), **_dict(options, f"{what}_options")}
        setattr(target, name, merged)
        return cfg
    setter.__name__ = f"set_{what}_options"
    setter.__doc__ = (f"Add ``{what}_options`` (a dict of Poplar option strings) to "
                      f"``opts.{attr}``; returns ``opts``.")
    return _deprecated(setter)


set_compilation_options = _poplar_setter("compilation_poplar_options", "compilation")
set_convolution_options = _poplar_setter("convolutions.poplar_options", "convolution")
set_pooling_options = _poplar_setter("pooling.poplar_options", "pooling")


@_deprecated
def set_matmul_options(opts: IPUConfig, matmul_options=None, clear_pass_type=False):
    """``matmuls.poplar_options`` and ``matmuls.clear_pass_type`` (seed 004:1059-1081)."""
    cfg = _opts(opts, "set_matmul_options")
    cfg.matmuls.poplar_options = {**cfg.matmuls.poplar_options,
                                  **_dict(matmul_options, "matmul_options")}
    cfg.matmuls.clear_pass_type = clear_pass_type
    return cfg


@_deprecated
def set_report_options(opts: IPUConfig, graph_options=None, execution_options=None):
    """Poplar report options (seed 004:1179-1201): checked, no effect (see the module)."""
    _dict(graph_options, "graph_options")
    _dict(execution_options, "execution_options")
    return _opts(opts, "set_report_options")


@_deprecated
def set_serialization_options(opts: IPUConfig, output_folder=""):
    """``serialization_output_folder`` (seed 004:1203-1222)."""
    cfg = _opts(opts, "set_serialization_options")
    cfg.serialization_output_folder = output_folder
    return cfg


@_deprecated
def set_transfer_options(opts: IPUConfig, use_verified_transfers=False):
    """Verified transfers (seed 004:1224-1237): checked (a bool), no effect."""
    if not isinstance(use_verified_transfers, bool):
        raise TypeError("use_verified_transfers must be a bool")
    return _opts(opts, "set_transfer_options")


@_deprecated
def set_verification_options(opts: IPUConfig, verification_options):
    """Verified transfers' keys (seed 004:1239-1260): checked, no effect."""
    if not isinstance(verification_options, VerificationOptions):
        raise TypeError("`verification_options` must be of type VerificationOptions")
    return _opts(opts, "set_verification_options")


@_deprecated
def set_ipu_connection_type(opts: IPUConfig, connection_type=DeviceConnectionType.ALWAYS,
                            ipu_version="", enable_remote_buffers=False):
    """``device_connection.type``, ``.version``, ``.enable_remote_buffers`` (seed
    004:1012-1040)."""
    cfg = _opts(opts, "set_ipu_connection_type")
    cfg.device_connection.type = connection_type or DeviceConnectionType.ALWAYS
    cfg.device_connection.version = ipu_version or ""
    cfg.device_connection.enable_remote_buffers = enable_remote_buffers
    return cfg


@_deprecated
def set_ipu_model_options(opts: IPUConfig, compile_ipu_code=True, tiles_per_ipu=None,
                          ipu_model_version="ipu2"):
    """``ipu_model.*`` (seed 004:1042-1057)."""
    cfg = _opts(opts, "set_ipu_model_options")
    cfg.ipu_model.compile_ipu_code = compile_ipu_code
    if tiles_per_ipu is not None:
        cfg.ipu_model.tiles_per_ipu = tiles_per_ipu
    cfg.ipu_model.version = ipu_model_version
    return cfg


@_deprecated
def set_io_tile_options(opts: IPUConfig, num_io_tiles, place_ops_on_io_tiles=None,
                        io_tile_available_memory_proportion=0.9):
    """``io_tiles.*`` (seed 004:995-1010); ``place_ops_on_io_tiles=None`` leaves it."""
    cfg = _opts(opts, "set_io_tile_options")
    cfg.io_tiles.num_io_tiles = num_io_tiles
    if place_ops_on_io_tiles is not None:
        cfg.io_tiles.place_ops_on_io_tiles = place_ops_on_io_tiles
    cfg.io_tiles.available_memory_proportion = io_tile_available_memory_proportion
    return cfg


@_deprecated
def set_floating_point_behaviour_options(opts: IPUConfig, inv=True, div0=True, oflo=True,
                                         esr=True, nanoo=True):
    """``floating_point_behaviour.*`` (seed 004:962-979); note the old defaults are True."""
    cfg = _opts(opts, "set_floating_point_behaviour_options")
    fpb = cfg.floating_point_behaviour
    fpb.inv, fpb.div0, fpb.oflo, fpb.nanoo = inv, div0, oflo, nanoo
    fpb.esr = esr if isinstance(esr, (bool, StochasticRoundingBehaviour)) else bool(esr)
    return cfg


@_deprecated
def set_gcl_options(opts: IPUConfig, gcl_options=None):
    """``gcl_poplar_options`` (seed 004:981-993)."""
    cfg = _opts(opts, "set_gcl_options")
    cfg.gcl_poplar_options = {**cfg.gcl_poplar_options, **_dict(gcl_options, "gcl_options")}
    return cfg


@_deprecated
def set_norm_options(opts: IPUConfig, use_stable_statistics=False,
                     experimental_distributed_batch_norm_replica_group_size=1):
    """``norms.*`` (seed 004:1083-1096)."""
    cfg = _opts(opts, "set_norm_options")
    cfg.norms.use_stable_statistics = use_stable_statistics
    cfg.norms.experimental.distributed_batch_norm_replica_group_size = \
        experimental_distributed_batch_norm_replica_group_size
    return cfg


def _merge_mode(value: Any) -> MergeRemoteBuffersBehaviour:
    """A MergeRemoteBuffersBehaviour, or TF-IPU's bool/None spelling of one."""
    if isinstance(value, MergeRemoteBuffersBehaviour):
        return value
    if value is None:
        return MergeRemoteBuffersBehaviour.IF_BENEFICIAL
    if isinstance(value, bool):
        return MergeRemoteBuffersBehaviour.MERGE if value \
            else MergeRemoteBuffersBehaviour.NO_MERGING
    raise TypeError(f"merge_remote_buffers must be a MergeRemoteBuffersBehaviour, not "
                    f"{value!r}")


@_deprecated
def set_optimization_options(opts: IPUConfig, combine_embedding_lookups=False,
                             combine_matmuls=False, max_cross_replica_sum_buffer_size=0,
                             max_reduce_scatter_buffer_size=0,
                             max_inter_ipu_copies_buffer_size=0, max_send_recv_cluster_size=0,
                             minimum_remote_tensor_size=128,
                             merge_remote_buffers=MergeRemoteBuffersBehaviour.NO_MERGING,
                             gather_simplifier=True, triangular_solve_expander_block_size=0,
                             cholesky_block_size=0, enable_fast_math=False):
    """``optimizations.*`` (seed 004:1100-1141; ``max_*`` are ``maximum_*`` there)."""
    o = _opts(opts, "set_optimization_options").optimizations
    o.combine_embedding_lookups, o.combine_matmuls = combine_embedding_lookups, combine_matmuls
    o.maximum_cross_replica_sum_buffer_size = max_cross_replica_sum_buffer_size
    o.maximum_reduce_scatter_buffer_size = max_reduce_scatter_buffer_size
    o.maximum_inter_ipu_copies_buffer_size = max_inter_ipu_copies_buffer_size
    o.maximum_send_recv_cluster_size = max_send_recv_cluster_size
    o.minimum_remote_tensor_size = minimum_remote_tensor_size
    o.merge_remote_buffers = _merge_mode(merge_remote_buffers)
    o.enable_gather_simplifier = gather_simplifier
    o.triangular_solve_expander_block_size = triangular_solve_expander_block_size
    o.cholesky_block_size = cholesky_block_size
    o.enable_fast_math = enable_fast_math
    return opts


@_deprecated
def set_recomputation_options(opts: IPUConfig, allow_recompute=True):
    """``allow_recompute`` (seed 004:1165-1177)."""
    cfg = _opts(opts, "set_recomputation_options")
    cfg.allow_recompute = allow_recompute
    return cfg


@_deprecated
def set_experimental_multi_replica_distribution_options(opts: IPUConfig, process_count,
                                                        process_index):
    """``experimental.multi_replica_distribution.*`` (seed 004:941-960).

    Raises:
        ValueError: not ``0 <= process_index < process_count`` (TF-IPU's message).
    """
    cfg = _opts(opts, "set_experimental_multi_replica_distribution_options")
    if not 0 <= process_index < process_count:
        raise ValueError("0 <= process_index < process_count")
    mrd = cfg.experimental.multi_replica_distribution
    mrd.process_count, mrd.process_index = process_count, process_index
    return cfg
