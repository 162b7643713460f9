"""``IPUConfig``: the configuration tree of the TF-IPU API, as far as ipupod emulates it.

The tree and defaults follow ``tensorflow.python.ipu.config.IPUConfig`` (seed ``004``
lines 1475-1904). Assigning an attribute that does not exist raises ``AttributeError``
naming the valid ones, so a typo never passes silently (the real IPUConfig does the same).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Sequence

from ipu_node.systems import canonical_system_name
from ipu_node.transport_names import TRANSPORT_NAMES


class SelectionOrder(enum.Enum):
    """Order in which a multi-IPU device's IPUs map to physical IPUs (seed 004:1324-1395)."""

    AUTO = 0
    ZIGZAG = 1
    SNAKE = 2
    HOOF = 3


class MergeRemoteBuffersBehaviour(enum.Enum):
    """When compatible remote buffers are merged (seed 004:1300-1308). ``NO_MERGING`` is 0
    (seed 004:1100); the values of the other two are ipupod assumptions (the seeds give
    none)."""

    NO_MERGING = 0
    MERGE = 1
    IF_BENEFICIAL = 2


class _ConfigGroup:
    """A node of the config tree: fixed attribute names, validated on assignment."""

    _fields: dict[str, Any] = {}
    #: fields whose values are secrets: repr() shows only whether they are set
    _secret_fields: frozenset[str] = frozenset()

    def __init__(self) -> None:
        for name, default in self._fields.items():
            value = default() if callable(default) and not isinstance(default, enum.Enum) else default
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._fields:
            valid = ", ".join(sorted(self._fields))
            raise AttributeError(
                f"{type(self).__name__} has no option {name!r}; valid options: {valid}")
        default = self._fields[name]
        if isinstance(default, type) and issubclass(default, _ConfigGroup) \
                and not isinstance(value, default):   # a group is replaced by a group only
            raise TypeError(f"{type(self).__name__}.{name} is a group of options "
                            f"({default.__name__}); it cannot be set to "
                            f"{type(value).__name__} {value!r}")
        check = getattr(self, f"_check_{name}", None)
        object.__setattr__(self, name, check(value) if check else value)
        self.__dict__.setdefault("_explicit", set()).add(name)

    def is_set(self, name: str) -> bool:
        """Whether option ``name`` was assigned (as opposed to holding its default)."""
        return name in self.__dict__.get("_explicit", ())

    def __repr__(self) -> str:
        def shown(k: str) -> str:
            if k in self._secret_fields:
                return "'<set>'" if getattr(self, k) else "''"
            return repr(getattr(self, k))
        items = ", ".join(f"{k}={shown(k)}" for k in self._fields)
        return f"{type(self).__name__}({items})"


def _int_at_least(name: str, value: Any, minimum: int) -> int:
    """``value`` when it is an int >= ``minimum`` (not a bool); else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_ipu_selection(name: str, value: Any) -> int | list[int]:
    """``auto_select_ipus``/``select_ipus``: an int, or a list/tuple of ints (seed 004:1496-1646)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a list of ints, not bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        return value
    if isinstance(value, (list, tuple)):
        bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int)]
        if bad:
            raise TypeError(
                f"{name} must be an int or a list of ints; got {type(bad[0]).__name__} "
                f"{bad[0]!r} in {list(value)!r}")
        if any(v < 0 for v in value):
            raise ValueError(f"{name} entries must be >= 0, got {list(value)!r}")
        return list(value)
    raise TypeError(f"{name} must be an int or a list of ints, not {type(value).__name__}")


def _check_address(name: str, value: Any) -> str:
    """``""`` or ``host:port`` with a port in [0, 65535]."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str 'host:port', not {type(value).__name__}")
    if value:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{name} must be 'host:port', got {value!r}")
    return value


class IPUModelConfig(_ConfigGroup):
    """``IPUConfig.ipu_model``: version ``"ipu1"``/``"ipu2"`` and tiles per IPU (0 = standard).

    Seed 004:1760-1766. When ``version`` is not assigned, the IPUs have the system's native
    version (``ipu1`` on C2-16, ``ipu2`` on the IPU-M2000 PODs); assigning it overrides that,
    as the IPU Model does. ``tiles_per_ipu`` > 0 overrides the tile count (and so the SRAM).
    """

    _fields = {"compile_ipu_code": True, "tiles_per_ipu": 0, "version": "ipu2"}

    def _check_version(self, value: Any) -> str:
        if value not in ("ipu1", "ipu2"):
            raise ValueError(f"ipu_model.version must be 'ipu1' or 'ipu2', got {value!r}")
        return value

    def _check_tiles_per_ipu(self, value: Any) -> int:
        return _int_at_least("ipu_model.tiles_per_ipu", value, 0)


class MultiReplicaDistributionConfig(_ConfigGroup):
    """``IPUConfig.experimental.multi_replica_distribution`` (seed 004:1694-1706).

    ``process_count`` instances each run ``local replicas``; the global replication factor is
    their product. 0 (the default) means no multi-replica distribution. ``transport`` is
    ipupod's own field: ``"auto"`` (MPI when ``process_count > 1``), ``"mpi"``, ``"grpc"`` or
    ``"local"``. The grpc transport also needs ``coordinator_address`` (``host:port``) and
    ``job_token``; ``listen_address`` is where its peer server listens (default
    ``127.0.0.1:0``). ``popdist.set_ipu_config`` fills them from poprun's environment or
    TF_CONFIG.
    """

    _fields = {"process_count": 0, "process_index": 0, "transport": "auto",
               "coordinator_address": "", "job_token": "", "listen_address": ""}
    _secret_fields = frozenset({"job_token"})

    def _check_process_count(self, value: Any) -> int:
        return _int_at_least("process_count", value, 0)

    def _check_process_index(self, value: Any) -> int:
        return _int_at_least("process_index", value, 0)

    def _check_transport(self, value: Any) -> str:
        if value != "auto" and value not in TRANSPORT_NAMES:
            known = ", ".join(repr(n) for n in ("auto", *TRANSPORT_NAMES))
            raise ValueError(f"transport must be one of {known}, got {value!r}")
        return value

    def _check_coordinator_address(self, value: Any) -> str:
        return _check_address("coordinator_address", value)

    def _check_listen_address(self, value: Any) -> str:
        return _check_address("listen_address", value)

    def _check_job_token(self, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError(f"job_token must be a str, not {type(value).__name__}")
        return value


class ExecutionConfig(_ConfigGroup):
    """``IPUConfig.execution`` (ipupod's own group): how the modelled clock prices compute.

    ``compute_efficiency``: the fraction of the IPU's peak FLOP/s a stage pass sustains, in
    (0, 1]; a pass of ``flops`` operations takes ``flops / (peak * compute_efficiency)``
    modelled seconds (:mod:`ipu_node.clock`). Default 0.5: ipupod assumption, no measured
    figure in the seeds or anchors; large dense matmuls run near peak, whole models with
    normalisation, element-wise ops and exchange well below it, and half of peak sits between
    the two. Set it from a profile of the real model when one exists.
    """

    _fields = {"compute_efficiency": 0.5}

    def _check_compute_efficiency(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not 0 < value <= 1:
            raise ValueError(f"execution.compute_efficiency must be a number in (0, 1], "
                             f"got {value!r}")
        return float(value)


class ExperimentalConfig(_ConfigGroup):
    """``IPUConfig.experimental``."""

    _fields = {"multi_replica_distribution": MultiReplicaDistributionConfig}


class OptimizationsConfig(_ConfigGroup):
    """``IPUConfig.optimizations``: the options of seed 004:1818-1845, with their defaults.

    ipupod uses ``maximum_cross_replica_sum_buffer_size`` and
    ``maximum_reduce_scatter_buffer_size`` (bytes): a collective called on a nest of arrays
    moves fused buffers of at most that many bytes, one collective per buffer (0, the
    default: one buffer per dtype; see ``collectives.ops``). The others are accepted and
    checked but change nothing in the emulation.
    """

    _fields = {"merge_infeed_io_copies": False,
               "maximum_cross_replica_sum_buffer_size": 0,
               "maximum_reduce_scatter_buffer_size": 0,
               "maximum_inter_ipu_copies_buffer_size": 0,
               "maximum_send_recv_cluster_size": 0,
               "minimum_remote_tensor_size": 128,
               "merge_remote_buffers": MergeRemoteBuffersBehaviour.IF_BENEFICIAL}

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "merge_infeed_io_copies":
            if not isinstance(value, bool):
                raise TypeError(f"optimizations.{name} must be a bool, not {value!r}")
        elif name == "merge_remote_buffers":
            if not isinstance(value, MergeRemoteBuffersBehaviour):
                raise TypeError(f"optimizations.{name} must be a MergeRemoteBuffersBehaviour, "
                                f"not {value!r}")
        elif name in self._fields:
            value = _int_at_least(f"optimizations.{name}", value, 0)
        super().__setattr__(name, value)


class IPUConfig(_ConfigGroup):
    """Configuration of this process's emulated IPU system.

    Set options by assignment, then call :meth:`configure_ipu_system`::

        cfg = IPUConfig()
        cfg.auto_select_ipus = 4          # one TF device /device:IPU:0 with 4 IPUs
        cfg.ipus_per_replica = 1          # ipupod: IPUs per model copy -> 4 local replicas
        cfg.configure_ipu_system()

    ``ipus_per_replica`` is ipupod's own option: it stands for the model's number of shards,
    which the real stack derives from the compiled graph. The local replication factor is the
    number of IPUs of ``/device:IPU:0`` divided by it.

    ``system`` is ipupod's own option too: the emulated system (``"POD16"``, ``"C2-16"``, ...,
    see :mod:`ipu_node.systems`); ``""`` (the default) means ``$IPUPOD_SYSTEM``, else POD16.

    ``allow_recompute`` (TF-IPU's option, reference execution-model.md §1.9): pipelines
    recompute each stage's forward before its backward (the numbers do not change; the
    modelled time pays the extra forward and the stash holds only stage inputs).
    ``execution`` is ipupod's group for the modelled clock (:class:`ExecutionConfig`).

    ``auto_select_ipus`` is an int (one TF device) or a list of ints, entry ``N`` being the
    number of IPUs of ``/device:IPU:N`` (seed 004:1496-1514); devices are named, not listed,
    so strings such as ``"/device:IPU:0"`` are rejected. ``select_ipus`` takes ``gc-info``
    device ids the same way (seed 004:1515-1646).

    Raises:
        AttributeError: assignment to an option that does not exist (names the valid ones).
        TypeError, ValueError: a value of the wrong type or range (names the option).
    """

    _fields = {
        "auto_select_ipus": list,
        "select_ipus": list,
        "selection_order": SelectionOrder.AUTO,
        "gcl_poplar_options": dict,
        "ipus_per_replica": 1,
        "system": "",
        "ipu_model": IPUModelConfig,
        "experimental": ExperimentalConfig,
        "optimizations": OptimizationsConfig,
        "execution": ExecutionConfig,
        "allow_recompute": False,
    }

    def _check_auto_select_ipus(self, value: Any) -> int | list[int]:
        return _check_ipu_selection("auto_select_ipus", value)

    def _check_select_ipus(self, value: Any) -> int | list[int]:
        return _check_ipu_selection("select_ipus", value)

    def _check_selection_order(self, value: Any) -> SelectionOrder:
        if not isinstance(value, SelectionOrder):
            raise TypeError(f"selection_order must be a SelectionOrder, not {value!r}")
        return value

    def _check_gcl_poplar_options(self, value: Any) -> dict:
        if not isinstance(value, dict):
            raise TypeError(f"gcl_poplar_options must be a dict, not {type(value).__name__}")
        return dict(value)

    def _check_allow_recompute(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"allow_recompute must be a bool, not {type(value).__name__}")
        return value

    def _check_system(self, value: Any) -> str:
        if value == "":
            return value
        return canonical_system_name(value)

    def _check_ipus_per_replica(self, value: Any) -> int:
        return _int_at_least("ipus_per_replica", value, 1)

    def device_ipu_counts(self) -> Sequence[int]:
        """IPUs of each TF device ``/device:IPU:N`` that ``auto_select_ipus`` asks for."""
        sel = self.auto_select_ipus
        return [sel] if isinstance(sel, int) else list(sel)

    def configure_ipu_system(self) -> "ipu_node.system.IPUSystem":  # noqa: F821
        """Attach the simulated IPUs and make this the process's IPU system.

        Returns:
            The configured :class:`~ipu_node.system.IPUSystem`.

        Raises:
            IPUConfigError: the options do not describe a usable system.
            AlreadyConfiguredError: replicas of the previous system are still running.
        """
        if _configure is None:  # (ipu_node/__init__ imports ipu_node.system, which installs it)
            raise RuntimeError("ipu_node.system is not imported: import ipu_node first")
        return _configure(self)


#: what :meth:`IPUConfig.configure_ipu_system` calls: :func:`ipu_node.system.configure`,
#: installed by that module (it imports this one; this one never imports it, so the
#: package has no import cycle)
_configure: Callable[[IPUConfig], Any] | None = None


def install_configure(configure: Callable[[IPUConfig], Any]) -> None:
    """Make ``configure(config)`` the function behind :meth:`IPUConfig.configure_ipu_system`
    (called once by :mod:`ipu_node.system`)."""
    global _configure
    _configure = configure
