"""``popdist.poptorch``: PopTorch options for an instance of a poprun job (poptorch reference
§8; Graphcore's popdist is not public, so the behaviour is that of its tests and examples).

``popdist.poptorch.Options(ipus_per_replica)`` is a ``poptorch.Options`` whose
``replicationFactor`` is this instance's local replicas and whose ``Distributed`` process id
and count are the instance index and count (0 and 1 outside poprun); under poprun it also
selects this instance's IPUs (``useIpuId(popdist.getDeviceId(ipus_per_replica))``). The
methods that would contradict poprun raise. Importing this module imports torch (``import
popdist`` does not).
"""

from __future__ import annotations

import poptorch
from poptorch.options._options_groups import DistributedOptions

from poprun import popdist as _popdist

__all__ = ["Options"]


def _blocked(name: str):
    def method(self, *args, **kwargs):
        raise RuntimeError(f"Cannot call `{name}` with popdist.poptorch.Options")
    method.__name__ = name.rsplit(".", 1)[-1]
    method.__doc__ = f"Blocked: poprun sets this (RuntimeError \"Cannot call `{name}` ...\")."
    return method


class _PopdistDistributed(DistributedOptions):
    """``Distributed`` of popdist's options: this instance's index and the job's instance
    count, from poprun (0 and 1 outside it); the program cannot set them."""

    def __init__(self) -> None:
        super().__init__((_popdist.getInstanceIndex(), _popdist.getNumInstances()))

    disable = _blocked("Distributed.disable")
    setEnvVarNames = _blocked("Distributed.setEnvVarNames")
    configureProcessId = _blocked("Distributed.configureProcessId")


class Options(poptorch.Options):
    """``poptorch.Options`` for this instance of a poprun job.

    Args:
        ipus_per_replica: IPUs of each replica (default: poprun's ``--ipus-per-replica``).

    Raises:
        ValueError: ``ipus_per_replica`` differs from poprun's ``--ipus-per-replica``, or the
            ``POPDIST_*`` environment is inconsistent.
    """

    def __init__(self, ipus_per_replica: int | None = None) -> None:
        _popdist.init()  # the POPDIST_* values agree with each other
        super().__init__()
        if ipus_per_replica is None:
            ipus_per_replica = _popdist.getNumIpusPerReplica()
        if not _popdist.checkNumIpusPerReplica(ipus_per_replica):
            raise ValueError(f"popdist.poptorch.Options(ipus_per_replica={ipus_per_replica}) "
                             "but poprun was started with --ipus-per-replica "
                             f"{_popdist.getNumIpusPerReplica()}")
        self._ipus_per_replica = ipus_per_replica
        self.set(replication_factor=_popdist.getNumLocalReplicas())
        if _popdist.isPopdistEnvSet():
            poptorch.Options.useIpuId(self, _popdist.getDeviceId(ipus_per_replica))

    def _distributed_options(self) -> DistributedOptions:
        return _PopdistDistributed()

    @property
    def ipus_per_replica(self) -> int:
        return self._ipus_per_replica

    useIpuId = _blocked("useIpuId")
    replicationFactor = _blocked("replicationFactor")
