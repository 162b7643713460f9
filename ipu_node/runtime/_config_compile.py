"""The option groups of :class:`ipu_node.config.IPUConfig` about compilation: convolutions,
matmuls, pooling, normalisations, graph optimisations and the instruction scheduler (seed
004:1648-1655, 1768-1884).

In ipupod the user's numpy (or PyTorch) code does the arithmetic and nothing is compiled, so
most of these are accepted and checked with no effect; each docstring says so and why. The
ones that act: ``optimizations.maximum_cross_replica_sum_buffer_size`` and
``maximum_reduce_scatter_buffer_size`` (how nests of tensors fuse into GCL collectives, and so
the modelled time), and ``norms.experimental.distributed_batch_norm_replica_group_size``'s
checks.
"""

from __future__ import annotations

from ipu_node.runtime._config_base import (ConfigGroup, bool_option, dict_option, enum_option,
                                           int_option)
from ipu_node.runtime._config_enums import MergeRemoteBuffersBehaviour, SchedulingAlgorithm

__all__ = ["ConvolutionsConfig", "MatmulsConfig", "PoolingConfig", "NormsConfig",
           "NormsExperimentalConfig", "OptimizationsConfig", "SchedulingConfig"]

_NO_OPS = ("ipupod: accepted, no effect: ipupod has no {what} of its own (the user's numpy "
           "or PyTorch code computes them), so there is nothing to pass these to.")


class ConvolutionsConfig(ConfigGroup):
    """``IPUConfig.convolutions`` (seed 004:1648-1655)."""

    _options = {"poplar_options": dict_option(
        "PopLibs convolution options, e.g. {'availableMemoryProportion': '0.3'} (seed "
        "004:1651-1655). " + _NO_OPS.format(what="convolutions"))}


class MatmulsConfig(ConfigGroup):
    """``IPUConfig.matmuls`` (seed 004:1768-1780)."""

    _options = {
        "clear_pass_type": bool_option(False, (
            "Do not tell PopLibs the matmuls' pass type (seed 004:1772). "
            + _NO_OPS.format(what="matmuls"))),
        "poplar_options": dict_option(
            "PopLibs matmul options, e.g. availableMemoryProportion (seed 004:1776-1780). "
            + _NO_OPS.format(what="matmuls")),
    }


class PoolingConfig(ConfigGroup):
    """``IPUConfig.pooling`` (seed 004:1862-1868)."""

    _options = {"poplar_options": dict_option(
        "PopLibs pooling options (seed 004:1866-1868). " + _NO_OPS.format(what="pooling"))}


class NormsExperimentalConfig(ConfigGroup):
    """``IPUConfig.norms.experimental`` (seed 004:1790-1796)."""

    _options = {"distributed_batch_norm_replica_group_size": int_option(1, (
        "Replicas whose batch-norm statistics are all-reduced together (seed 004:1794-1796). "
        "ipupod: checked (at least 1, TF-IPU's message; not with I/O tiles, TF-IPU's error "
        "at configure; the group must divide the replicas), no other effect: ipupod has no "
        "batch-norm op (a program's own batch norm can call cross_replica_mean with "
        "replica_group_size)."), minimum=1)}


class NormsConfig(ConfigGroup):
    """``IPUConfig.norms`` (seed 004:1782-1796)."""

    _options = {"use_stable_statistics": bool_option(False, (
        "Compute the mean first for a stabler variance (seed 004:1786-1788). "
        + _NO_OPS.format(what="normalisation ops")))}
    _groups = {"experimental": NormsExperimentalConfig}


def _no_compiler(what: str) -> str:
    return (f"ipupod: accepted, no effect: {what}; ipupod runs the user's code eagerly and "
            "compiles no graph.")


class OptimizationsConfig(ConfigGroup):
    """``IPUConfig.optimizations`` (seed 004:1798-1860)."""

    _options = {
        "prefetch_data_streams": bool_option(True, (
            "Overlap the host's data prefetch with execution (seed 004:1802). ipupod: "
            "accepted, no effect: the modelled clock charges each fed element's host "
            "transfer where the feed is read and does not model host-side prefetch.")),
        "combine_embedding_lookups": bool_option(False, (
            "Fuse embedding lookups on the same tensor (seed 004:1806). "
            + _no_compiler("ipupod has no embedding op"))),
        "combine_matmuls": bool_option(False, (
            "Fuse matmuls sharing weights or input (seed 004:1810). "
            + _no_compiler("the matmuls are the user's numpy"))),
        "enable_graph_outlining": bool_option(True, (
            "Outline identical operations to reuse code (seed 004:1814). "
            + _no_compiler("there is no program code to share"))),
        "merge_infeed_io_copies": bool_option(False, (
            "Merge the host-to-device input copies into one (seed 004:1818). ipupod: "
            "accepted, no effect: the modelled clock charges each fed element as one "
            "transfer already.")),
        "maximum_cross_replica_sum_buffer_size": int_option(0, (
            "Bytes that may wait before a cross-replica sum is scheduled; 0 schedules them "
            "at once (seed 004:1822-1824). ipupod: acts: a collective called on a nest of "
            "arrays moves fused buffers of at most this many bytes, one modelled GCL "
            "collective per buffer (0: one buffer per dtype; collectives.ops).")),
        "maximum_reduce_scatter_buffer_size": int_option(0, (
            "Bytes that may wait before a reduce-scatter is scheduled (seed 004:1826-1828). "
            "ipupod: acts, as maximum_cross_replica_sum_buffer_size for reduce_scatter.")),
        "maximum_inter_ipu_copies_buffer_size": int_option(0, (
            "Bytes that may wait before an inter-IPU copy is scheduled (seed 004:1830-1832). "
            "ipupod: accepted, no effect: a pipeline's copies between stages are charged one "
            "per stage output and step (ipu_node.clock).")),
        "maximum_send_recv_cluster_size": int_option(0, (
            "Bytes that may wait before a host send/recv cluster is scheduled (seed "
            "004:1834-1836). ipupod: accepted, no effect: host transfers are charged one per "
            "fed element.")),
        "minimum_remote_tensor_size": int_option(128, (
            "Smallest tensor (bytes) considered for remote memory (seed 004:1838). ipupod: "
            "accepted, no effect: nothing is placed in Streaming Memory.")),
        "merge_remote_buffers": enum_option(MergeRemoteBuffersBehaviour.IF_BENEFICIAL, (
            "Merge compatible remote buffers (seed 004:1842-1844). ipupod: accepted, no "
            "effect: there are no remote buffers.")),
        "enable_gather_simplifier": bool_option(True, (
            "More aggressive optimisation of embedding lookups (seed 004:1846). "
            + _no_compiler("ipupod has no embedding op"))),
        "triangular_solve_expander_block_size": int_option(0, (
            "Block size of the triangular solver expander; 0: the implementation's (seed "
            "004:1850-1852). " + _no_compiler("ipupod has no triangular solve"))),
        "cholesky_block_size": int_option(0, (
            "Block size of the Cholesky factoriser; 0: the implementation's (seed "
            "004:1854-1856). " + _no_compiler("ipupod has no Cholesky op"))),
        "enable_fast_math": bool_option(False, (
            "Allow reassociation without accuracy guarantees (seed 004:1858-1860). ipupod: "
            "accepted, no effect: numpy evaluates as the program writes it, and ipupod's "
            "collectives keep their fixed summation order whatever this says.")),
    }


class SchedulingConfig(ConfigGroup):
    """``IPUConfig.scheduling`` (seed 004:1870-1884)."""

    _options = {
        "algorithm": enum_option(SchedulingAlgorithm.CHOOSE_BEST, (
            "The compiler's instruction scheduler (seed 004:1874-1876). "
            + _no_compiler("operations run in the order the program calls them"))),
        "maximum_scheduler_lookahead_depth": int_option(5, (
            "How far LOOK_AHEAD looks (seed 004:1878-1880). "
            + _no_compiler("there is no scheduler")), minimum=1),
        "maximum_scheduler_search_space_size": int_option(64, (
            "LOOK_AHEAD's search space limit (seed 004:1882-1884). "
            + _no_compiler("there is no scheduler")), minimum=1),
    }
