"""The option groups of :class:`ipu_node.config.IPUConfig` about the device: when to attach,
the IPU Model, I/O tiles, floating-point behaviour, the experimental group (multi-replica
distribution) and ipupod's own ``execution`` group (seed 004:1657-1766).

Each option's docstring says what TF-IPU does with it and what ipupod does: acts on the
emulation, or is accepted and checked with no effect (and why).
"""

from __future__ import annotations

from typing import Any

from ipu_node.runtime._config_base import (ConfigGroup, Option, bool_option, float_option,
                                           int_option, enum_option, str_option, strict)
from ipu_node.runtime._config_enums import DeviceConnectionType, StochasticRoundingBehaviour
from ipu_node.transport_names import TRANSPORT_NAMES

__all__ = ["DeviceConnectionConfig", "IPUModelConfig", "IOTilesConfig",
           "FloatingPointBehaviourConfig", "MultiReplicaDistributionConfig",
           "ExperimentalConfig", "ExecutionConfig"]

_VERSIONS = ("ipu1", "ipu2")


class DeviceConnectionConfig(ConfigGroup):
    """``IPUConfig.device_connection``: when to attach to the IPUs (seed 004:1657-1680)."""

    _options = {
        "type": enum_option(DeviceConnectionType.ALWAYS, (
            "When to attach (seed 004:1661-1666). ipupod: acts: ALWAYS attaches the IPUs when the "
            "system is configured (they are held in the partition from then on); ON_DEMAND "
            "chooses them then and attaches them when a program first runs on them "
            "(strategy.run, ipu_compiler.compile), failing then if another process holds "
            "them; PRE_COMPILE and NEVER attach no IPUs: the simulated IPUs exist for "
            "placement and memory checks, and running a program on them raises "
            "DeviceNotAttachedError naming this option (TF-IPU's PRE_COMPILE returns zeros; "
            "ipupod refuses rather than hand out numbers no IPU computed).")),
        "version": str_option("", (
            "IPU version for PRE_COMPILE/NEVER: 'ipu1', 'ipu2' or '' (seed 004:1668-1670); "
            "required with those types (ValueError at configure, TF-IPU's message). ipupod: "
            "acts: the simulated IPUs are of this version then."), choices=("", *_VERSIONS)),
        "enable_remote_buffers": bool_option(False, (
            "Whether the system the program will run on has remote buffers (seed "
            "004:1672-1680). ipupod: accepted, no effect: the emulated IPU-M2000/Bow "
            "systems have Streaming Memory, and the offload options that would use it are "
            "recorded only (pipelining_ops).")),
    }


class IPUModelConfig(ConfigGroup):
    """``IPUConfig.ipu_model`` (seed 004:1752-1766). When ``version`` is not assigned, the
    IPUs have the system's native version (``ipu1`` on C2-16, ``ipu2`` on the IPU-M2000
    PODs); assigning it overrides that, as the IPU Model does."""

    _options = {
        "compile_ipu_code": bool_option(True, (
            "Whether the IPU Model compiles IPU code (seed 004:1756-1758). ipupod: accepted, "
            "no effect: ipupod compiles nothing, and its memory accounting counts tensors "
            "only, never code (ipu_node.runtime.memory).")),
        "tiles_per_ipu": int_option(0, (
            "Tiles per IPU; 0 is the version's standard count (seed 004:1760-1762). ipupod: "
            "acts: the simulated IPUs have this many tiles and so this much SRAM "
            "(ipu_node.runtime.device.SRAM_BYTES_PER_TILE per tile).")),
        "version": str_option("ipu2", (
            "'ipu1' or 'ipu2' (seed 004:1764-1766). ipupod: acts when assigned: the IPUs "
            "are of this version (tiles, SRAM, peak FLOP/s)."), choices=_VERSIONS),
    }


class IOTilesConfig(ConfigGroup):
    """``IPUConfig.io_tiles``: tiles reserved for parallel I/O (seed 004:1738-1750)."""

    _options = {
        "num_io_tiles": int_option(0, (
            "Tiles per IPU reserved for I/O (seed 004:1740). ipupod: acts: they are taken "
            "from compute, so each IPU has (tiles - num_io_tiles) tiles of SRAM for tensors "
            "and its modelled compute runs at that fraction of peak; it must leave at least "
            "one compute tile (IPUConfigError at configure).")),
        "place_ops_on_io_tiles": bool_option(False, (
            "Place TensorFlow I/O operations on the I/O tiles (seed 004:1744). ipupod: "
            "checked (it needs num_io_tiles > 0, TF-IPU's error at configure); no other "
            "effect: feed buffers live on the host in ipupod.")),
        "available_memory_proportion": float_option(0.9, (
            "Share of the I/O tiles' memory that may hold data (seed 004:1748-1750). ipupod: "
            "accepted, in [0, 1], no effect: nothing is placed on I/O tiles.")),
    }


def _esr_ok(value: Any) -> bool:
    return type(value) is bool or isinstance(value, StochasticRoundingBehaviour)


class FloatingPointBehaviourConfig(ConfigGroup):
    """``IPUConfig.floating_point_behaviour`` (seed 004:1708-1734; Poplar's
    ``FloatingPointBehaviour``)."""

    _options = {
        "inv": bool_option(False, (
            "An invalid operation (IEEE 754) raises an exception (seed 004:1712). ipupod: "
            "acts: inside replica functions numpy's 'invalid' event raises "
            "IPUFloatingPointError (a FloatingPointError) naming the option, as the IPU's "
            "exception stops the program.")),
        "div0": bool_option(False, (
            "A division by zero raises an exception (seed 004:1716). ipupod: acts: numpy's "
            "'divide' event raises IPUFloatingPointError inside replica functions.")),
        "oflo": bool_option(False, (
            "An overflow raises an exception (seed 004:1720). ipupod: acts: numpy's 'over' "
            "event raises IPUFloatingPointError inside replica functions.")),
        "esr": Option(False, "typing.Union[bool, StochasticRoundingBehaviour]", (
            "Stochastic rounding (seed 004:1724; later SDKs take a "
            "StochasticRoundingBehaviour). ipupod: accepted, no effect: numpy rounds to "
            "nearest, and the user's numpy code does the arithmetic."), check=_esr_ok),
        "nanoo": bool_option(False, (
            "NaN on overflow (seed 004:1728). ipupod: accepted, no effect: numpy gives inf "
            "on overflow (set oflo to stop there instead).")),
        "set_all": bool_option(False, (
            "Enables inv, div0, oflo, esr and nanoo when configured (seed 004:1732-1734). "
            "ipupod: acts through inv, div0 and oflo.")),
    }

    def errstate(self) -> dict[str, str]:
        """The ``numpy.errstate`` keywords these options ask for inside replica functions
        (empty when none of inv, div0, oflo is on)."""
        on = {k: self.set_all or getattr(self, k) for k in ("inv", "div0", "oflo")}
        names = {"inv": "invalid", "div0": "divide", "oflo": "over"}
        return {names[k]: "raise" for k, v in on.items() if v}


def _address(name: str, value: str) -> str:
    """``""`` or ``host:port`` with a port in [0, 65535]."""
    if value:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{name} must be 'host:port', got {value!r}")
    return value


def _transport(name: str, value: str) -> str:
    if value != "auto" and value not in TRANSPORT_NAMES:
        known = ", ".join(repr(n) for n in ("auto", *TRANSPORT_NAMES))
        raise ValueError(f"transport must be one of {known}, got {value!r}")
    return value


class MultiReplicaDistributionConfig(ConfigGroup):
    """``IPUConfig.experimental.multi_replica_distribution`` (seed 004:1694-1706).

    ``process_count`` instances each run the local replicas; the global replication factor
    is their product; 0 (the default) means no multi-replica distribution. ``transport``,
    ``coordinator_address``, ``job_token`` and ``listen_address`` are ipupod's own options
    (how instances reach each other); ``popdist.set_ipu_config`` fills them from poprun's
    environment or TF_CONFIG.
    """

    _options = {
        "process_index": int_option(0, "The index of this process (seed 004:1700). ipupod: "
                                       "acts: this instance's place in the job."),
        "process_count": int_option(0, (
            "The number of processes; 0 disables multi-replica distribution (seed "
            "004:1704). ipupod: acts: the instances of the job.")),
        "transport": str_option("auto", (
            "ipupod's own: 'auto' (MPI when process_count > 1), 'mpi', 'grpc' or 'local'."),
            validate=_transport),
        "coordinator_address": str_option("", "ipupod's own: the grpc transport's coordinator "
                                              "'host:port'.", validate=_address),
        "job_token": str_option("", "ipupod's own: the job's secret (repr shows only whether "
                                    "it is set)."),
        "listen_address": str_option("", "ipupod's own: where the grpc peer server listens "
                                         "(default 127.0.0.1:0).", validate=_address),
    }
    _secret = frozenset({"job_token"})


class ExperimentalConfig(ConfigGroup):
    """``IPUConfig.experimental`` (seed 004:1682-1706)."""

    _options = {
        "always_rearrange_copies_on_the_host": bool_option(False, (
            "Rearrange streamed data on the host instead of the device (seed "
            "004:1686-1688). ipupod: accepted, no effect: numpy arrays have one layout on "
            "both sides, so there is nothing to rearrange.")),
        "enable_remote_buffer_embedding": bool_option(False, (
            "HostEmbedding uses Poplar remote buffers (seed 004:1690-1692). ipupod: "
            "accepted, no effect: ipupod has no HostEmbedding.")),
        "enable_prng_stability": bool_option(False, (
            "Later TF-IPU's seed management against weight divergence under stochastic "
            "rounding. ipupod: accepted, no effect: there is no stochastic rounding.")),
    }
    _groups = {"multi_replica_distribution": MultiReplicaDistributionConfig}


def _efficiency(name: str, value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


class ExecutionConfig(ConfigGroup):
    """``IPUConfig.execution`` (ipupod's own group): how the modelled clock prices compute.

    ``compute_efficiency``: the fraction of the IPU's peak FLOP/s a stage pass sustains, in
    (0, 1]; a pass of ``flops`` operations takes ``flops / (peak * compute_efficiency)``
    modelled seconds (:mod:`ipu_node.clock`). Default 0.5: ipupod assumption, no measured
    figure in the seeds or anchors; large dense matmuls run near peak, whole models with
    normalisation, element-wise ops and exchange well below it, and half of peak sits between
    the two. Set it from a profile of the real model when one exists. PopTorch programs
    are priced per operation instead (:mod:`collectives.performance.compute_model`) unless
    this is set to other than its default: then it overrides that model
    (:func:`ipu_node.clock.efficiency_overridden`).
    """

    _options = {
        "compute_efficiency": Option(0.5, "float", (
            "Fraction of peak FLOP/s a stage pass sustains, in (0, 1] (ipupod's own; an int "
            "is accepted too)."), check=strict(int, float), validate=_efficiency),
    }
