"""``ipu_compiler.compile``: run a computation on the IPU replicas [004:14-41].

ipupod is eager: ``compile`` runs the computation now and returns its values.

* Inside a strategy's ``scope()`` (``IPUMultiReplicaStrategy``) the computation runs once on
  every local replica, concurrently, and ``compile`` returns local replica 0's values (TF-IPU
  copies device-to-host results from replica 0 only [PE:2762-2770]; in a multi-instance job
  each instance gets its own first replica's). Collectives work inside.
* Inside a replica function already (``strategy.run``), it runs in that replica.
* Otherwise it runs as one unreplicated replica (index 0 of 1) in the calling thread. Its IPUs
  are all the IPUs of ``/device:IPU:0`` of the configured system, which its ``ipu_shard``
  scopes index (TF1 without replication: the graph is sharded over the device's IPUs, as in
  the 4-shard tutorial [002:189-230]).

Compiling needs a configured IPU system (``configure_ipu_system``): without one
:class:`~ipu_node.errors.NotConfiguredError` names it, as TF-IPU fails to find the device.
The system's ``device_connection.type`` and ``floating_point_behaviour`` apply.

Placement: TF-IPU raises when the computation was not placed on an IPU [004:39-41]. ipupod
requires ``ipu_scope('/device:IPU:0')`` around the call, or a strategy scope (whose replicas
are on ``/device:IPU:0``), or a replica function; otherwise :class:`NotPlacedOnIPUError`.
Replicas run on ``/device:IPU:0`` only.

Results (TF-IPU's rules): a list of the computation's tensors; a single value comes back in
a 1-element list (the tutorial prints ``[array([ 4., 14.], dtype=float32)]`` [002:230]);
``None`` or only Operations give ``None`` (TF: a NoOp).
"""

from __future__ import annotations

from typing import Any, Callable

from ipu_node.errors import NotConfiguredError, NotPlacedOnIPUError
from ipu_node.execution import loops, scopes
from ipu_node.execution.operation import Operation
from ipu_node.runtime.replica import (ReplicaContext, ReplicaExecutor, active_runner,
                                      current_replica_context)
from ipu_node.runtime.system import get_system

__all__ = ["compile"]

_NOT_PLACED = (
    "A computation has been compiled, however it was not placed on an IPU device. This "
    "computation will not be executed on an IPU. To execute it on an IPU use the `ipu_scope`, "
    "for example:\n\n    with ipu_scope('/device:IPU:0'):\n"
    "      result = ipu_compiler.compile(comp, inputs)\n\n(or call it inside a strategy's "
    "scope())")


def compile(computation: Callable[..., Any], inputs: Any = None) -> list | None:  # noqa: A001
    """Run ``computation(*inputs)`` on the replicas (module docstring) and return its values.

    Args:
        computation: a function of ``len(inputs)`` arguments returning tensors followed by
            Operations, a single value, or None.
        inputs: a list of inputs (each may be a nest), a single input, or None (no inputs).

    Returns:
        Local replica 0's tensors as a list, or None.

    Raises:
        NotPlacedOnIPUError: not under ``ipu_scope``, a strategy scope or a replica.
        ValueError: ``ipu_scope`` names a device other than ``/device:IPU:0``; the
            computation returns Operations before tensors.
        Whatever the computation raises (on the first replica that raised).
    """
    args = [] if inputs is None else list(inputs) if isinstance(inputs, (list, tuple)) \
        else [inputs]
    device = scopes.current_ipu_scope()
    ctx = current_replica_context()
    runner = active_runner()
    if device is None and ctx is None and runner is None:
        raise NotPlacedOnIPUError(_NOT_PLACED)
    if device is not None and scopes.device_ordinal(device) != 0:
        raise ValueError(f"ipupod runs replicas on /device:IPU:0; compile was called under "
                         f"ipu_scope({device!r})")
    saved = scopes.placement()

    def per_replica():
        with scopes.restored_placement(saved), loops.frame("compile", 1):
            return _outputs(computation(*args))

    if ctx is not None:
        return per_replica()
    if runner is not None:
        return runner(per_replica)[0]
    system = _configured()
    system.require_attached("ipu_compiler.compile")
    executor = ReplicaExecutor([_single_replica(system)],
                               errstate=system.config.floating_point_behaviour.errstate())
    return executor.run(per_replica, [()], [{}])[0]


def _configured():
    try:
        return get_system()
    except NotConfiguredError:
        raise NotConfiguredError(
            "ipu_compiler.compile: no IPU system is configured, so the computation has no "
            "IPU to run on: call configure_ipu_system first (cfg = IPUConfig(); "
            "cfg.auto_select_ipus = 1; cfg.configure_ipu_system())") from None


def _single_replica(system) -> ReplicaContext:
    return ReplicaContext(replica_index=0, local_index=0, num_replicas=1,
                          num_local_replicas=1, ipus=tuple(system.devices[0].ipus))


def _outputs(result: Any) -> list | None:
    if result is None or isinstance(result, Operation):
        return None
    if not isinstance(result, (list, tuple)):
        return [result]
    tensors = [r for r in result if not isinstance(r, Operation)]
    if any(isinstance(r, Operation) for r in result[:len(tensors)]):
        raise ValueError("The computation must return zero or more Tensor values followed by "
                         "zero or more Operations.")
    return tensors or None
