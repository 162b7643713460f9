"""``gc-reset``: clear what killed jobs left on the emulated system.

A real ``gc-reset`` "Resets an IPU device" (seed 001:571), refusing one a process has
attached. The emulated IPUs hold no state between programs; what a killed job can leave is
in the occupancy directory (:mod:`ipu_node.runtime.occupancy`): the partition directories of
launchers that were killed before removing them, and lock files whose holder died. Both are
harmless to new jobs (poprun reclaims the former when it reserves a partition, and a dead
holder's lock is free), but they clutter it; ``gc-reset`` removes them:

* every stale partition, by poprun's own reclaim
  (:meth:`ipu_node.runtime.occupancy.Occupancy.reclaim_stale_scopes`; a named partition kept with
  ``--remove-partition no`` stays);
* every lock file of the device's IPUs that no live process holds, in every partition, each
  taken and released as an attach would (so a process attaching at that moment is never
  disturbed).

``gc-reset -d ID`` resets device ``ID`` (a gc-info id; its IPUs), ``gc-reset -a`` (the
default) every IPU. A device with an IPU attached by a live process is refused, naming it
(exit 1), and nothing is removed.
"""

from __future__ import annotations

import os
import re
import sys

from ipu_node.errors import IPUBusyError, IPUError
from ipu_node.hardware.device_ids import gc_device
from ipu_node.hardware.systems import SystemModel
from ipu_node.runtime.occupancy import MACHINE_SCOPE, Occupancy
from ipu_node.tools._common import EXIT_USAGE, fail, parse, parser

#: exit status of a reset refused because the device is in use
EXIT_IN_USE = 1


def _stale_lock_files(model: SystemModel, ipus: set[int]) -> list[tuple[str, int]]:
    """``(partition, IPU)`` of the lock files of ``ipus`` that no live process holds."""
    occupancy = Occupancy(model.name, MACHINE_SCOPE)
    held = {(h.scope, h.ipu_id) for h in occupancy.holders(all_scopes=True)}
    if not os.path.isdir(occupancy.system_dir):
        return []
    found = []
    for scope in sorted(os.listdir(occupancy.system_dir)):
        scope_dir = os.path.join(occupancy.system_dir, scope)
        if not os.path.isdir(scope_dir):
            continue
        for entry in sorted(os.listdir(scope_dir)):
            m = re.fullmatch(r"ipu-(\d+)\.lock", entry)
            if m and int(m.group(1)) in ipus and (scope, int(m.group(1))) not in held:
                found.append((scope, int(m.group(1))))
    return found


def reset(model: SystemModel, ipus: set[int]) -> list[str]:
    """Clear what killed jobs left for ``ipus`` of ``model`` (module docstring); returns one
    line per thing removed.

    Raises:
        IPUBusyError: a live process has one of ``ipus`` attached (names it); nothing is
            removed.
        OccupancyDirError: the occupancy directory is unusable or unsafe.
    """
    machine = Occupancy(model.name, MACHINE_SCOPE)
    busy = [h for h in machine.holders(all_scopes=True) if h.ipu_id in ipus]
    if busy:
        raise IPUBusyError(f"IPU {busy[0].ipu_id} is attached by {busy[0].describe()}; "
                           "stop it first (see gc-monitor)")
    done = [f"removed partition {scope}: its job ended without removing it"
            for scope in machine.reclaim_stale_scopes()]
    root = os.path.dirname(machine.system_dir)
    for scope, ipu in _stale_lock_files(model, ipus):
        try:
            Occupancy(model.name, scope, root).acquire([ipu]).release()
        except IPUBusyError:  # attached this very moment: its holder is alive, keep it
            continue
        done.append(f"cleared the lock file of IPU {ipu} in partition {scope}: its holder "
                    "has ended")
    return done


def main(argv: list[str] | None = None) -> int:
    """Reset a device (``-d ID``) or every IPU (``-a``, the default); returns the exit
    status (1: in use, 2: bad arguments)."""
    p = parser("gc-reset", "Clear what killed jobs left on the emulated IPU system.")
    which = p.add_mutually_exclusive_group()
    which.add_argument("-d", "--device-id", type=int, metavar="ID", help="device to reset")
    which.add_argument("-a", "--all", action="store_true", help="reset every IPU (default)")
    args, model = parse(p, argv)
    if model is None:
        return EXIT_USAGE
    try:
        if args.device_id is None:
            name, ipus = "every IPU", set(range(model.num_ipus))
        else:
            device = gc_device(model, args.device_id)
            name, ipus = f"device {device.id}", set(device.ipus)
    except IPUError as exc:
        return fail(p.prog, exc)
    try:
        done = reset(model, ipus)
    except IPUBusyError as exc:
        print(f"{p.prog}: cannot reset {name} of {model.name}: {exc}", file=sys.stderr)
        return EXIT_IN_USE
    except IPUError as exc:
        return fail(p.prog, exc)
    for line in done:
        print(line)
    print(f"Reset {name} of {model.name}: "
          + (f"{len(done)} left over {'item' if len(done) == 1 else 'items'} cleared"
             if done else "nothing to clear"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
