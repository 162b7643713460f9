"""Device ids as ``gc-info -l`` numbers them.

The rule (seeds-inventory §2.2, from the listing of seed 004:749-846):

1. ids ``0 .. N-1`` are the single IPUs, id = IPU id;
2. then come the multi-IPU devices of 2 IPUs, then of 4, 8, ... up to all N IPUs, ids
   increasing without gaps (``2N - 1`` devices in all);
3. a device of ``2^k`` IPUs (``k >= 2``) is the concatenation of two consecutive devices of
   ``2^(k-1)`` IPUs: the first of size ``2^k`` joins the first two of size ``2^(k-1)``, and so
   on. Its members are listed in that order (the "DNC Id" is the position).

Only the 2-IPU devices differ between systems:

* ``C2-16``: the seeds' pairs, verbatim: 16=[5,7], 17=[4,6], 18=[3,1], 19=[2,0],
  20=[13,15], 21=[12,14], 22=[9,11], 23=[10,8] (seed 004:768-791). With rule 3 this gives
  the seeds' 24=[5,7,4,6] ... 30=[5,7,4,6,3,1,2,0,13,15,12,14,9,11,10,8] member for member.
* IPU-M2000 systems: IPUs ``[2k, 2k+1]``, ascending, as ``gc-info`` lists them on an IPU-POD
  (docs.graphcore.ai command-line-tools "gc-info", List devices: 4=[0,1], 5=[2,3],
  6=[0,1,2,3]). So a device of ``2^k`` IPUs is the block of consecutive IPU ids
  ``[j*2^k, (j+1)*2^k)``: 4 IPUs are one machine, 64 one POD64.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ipu_node.errors import UnknownDeviceError
from ipu_node.hardware.systems import SystemModel

#: The 2-IPU devices of the seeds' 16-IPU C2 server, members in order (seed 004:768-791).
C2_16_PAIRS = ((5, 7), (4, 6), (3, 1), (2, 0), (13, 15), (12, 14), (9, 11), (10, 8))


@dataclass(frozen=True)
class GcDevice:
    """A device of the ``gc-info -l`` listing.

    Attributes:
        id: the device id (``select_ipus`` takes it).
        ipus: member IPU ids, in listing ("DNC Id") order.
    """

    id: int
    ipus: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ipus)

    @property
    def is_multi(self) -> bool:
        return len(self.ipus) > 1


def _pairs(model: SystemModel) -> tuple[tuple[int, int], ...]:
    if model.name == "C2-16":
        return C2_16_PAIRS
    return tuple((2 * k, 2 * k + 1) for k in range(model.num_ipus // 2))


@functools.lru_cache(maxsize=None)
def gc_devices(model: SystemModel) -> tuple[GcDevice, ...]:
    """All devices of ``model`` in id order (``devices[i].id == i``)."""
    devices = [GcDevice(i, (i,)) for i in range(model.num_ipus)]
    level: list[tuple[int, ...]] = [tuple(p) for p in _pairs(model)]
    while level:
        devices += [GcDevice(len(devices) + k, members) for k, members in enumerate(level)]
        level = [level[k] + level[k + 1] for k in range(0, len(level) - 1, 2)]
    return tuple(devices)


def gc_device(model: SystemModel, device_id: int) -> GcDevice:
    """The device ``device_id`` of ``model``.

    Raises:
        UnknownDeviceError: no such device id (the message gives the range and gc-info -l).
    """
    devices = gc_devices(model)
    if isinstance(device_id, bool) or not isinstance(device_id, int) or not (
            0 <= device_id < len(devices)):
        raise UnknownDeviceError(
            f"device id {device_id!r} does not exist on {model.name}: its device ids are "
            f"0..{len(devices) - 1} (see `gc-info -l --system {model.name}`)")
    return devices[device_id]


def devices_of_size(model: SystemModel, num_ipus: int) -> tuple[GcDevice, ...]:
    """The devices of exactly ``num_ipus`` IPUs, in id order (empty if there are none)."""
    return tuple(d for d in gc_devices(model) if d.size == num_ipus)


def device_sizes(model: SystemModel) -> tuple[int, ...]:
    """The device sizes of ``model``: 1, 2, 4, ... up to its number of IPUs."""
    return tuple(sorted({d.size for d in gc_devices(model)}))


@functools.lru_cache(maxsize=None)
def _by_members(model: SystemModel) -> dict[frozenset[int], GcDevice]:
    return {frozenset(d.ipus): d for d in gc_devices(model)}


def find_device(model: SystemModel, ipus) -> GcDevice | None:
    """The device whose members are the set ``ipus`` (any order), or None."""
    return _by_members(model).get(frozenset(ipus))
