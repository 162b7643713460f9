"""The topology table ``poprun --print-topology`` prints: hosts, ILDs, instances, replicas, IPUs.

A pure function of the system model and the job's shape, so poprun can print it (and fail on a
job that does not fit) before any instance starts. The layout follows PopRun's table (anchors
§1.1): one row per level, merged cells spanning the replicas below them::

    | hosts     | localhost             |
    | ILDs      | 0         | 0         |
    | instances | 0         | 1         |
    | replicas  | 0   | 1   | 2   | 3   |
    | IPUs      | 0,1 | 2,3 | 4,5 | 6,7 |

(POD16, 2 instances, 4 replicas of 2 IPUs.)
The IPUs are those :func:`ipu_node.selection.assign_instance_ipus` gives each instance, in
the AUTO selection order its replicas use.
"""

from __future__ import annotations

from typing import Sequence

from ipu_node.hardware.selection import assign_instance_ipus
from ipu_node.hardware.systems import SystemModel


def _spans(num_columns: int, groups: int) -> list[tuple[int, int]]:
    per = num_columns // groups
    return [(g * per, (g + 1) * per) for g in range(groups)]


def format_topology_table(model: SystemModel, *, num_instances: int, num_replicas: int,
                          ipus_per_replica: int = 1,
                          hosts: Sequence[str] = ("localhost",),
                          within: Sequence[int] | None = None) -> str:
    """The table of hosts, IPU-Link domains, instances, replicas and their IPUs.

    Instances are divided evenly among ``hosts`` and replicas evenly among instances, as
    poprun does; ``within`` is the job's partition (None: the whole system).

    Raises:
        ValueError: ``num_replicas`` is not a multiple of ``num_instances``, or
            ``num_instances`` not a multiple of the number of hosts.
        NotEnoughIPUsError: the job needs more IPUs than ``model`` has.
    """
    hosts = list(hosts)
    if not hosts:
        raise ValueError("hosts must name at least one host")
    if num_instances < 1 or num_replicas % num_instances:
        raise ValueError(f"--num-replicas ({num_replicas}) must be a multiple of "
                         f"--num-instances ({num_instances})")
    if num_instances % len(hosts):
        raise ValueError(f"{num_instances} instances cannot be divided evenly among "
                         f"{len(hosts)} hosts")
    local = num_replicas // num_instances
    per_instance = assign_instance_ipus(model, num_instances, local, ipus_per_replica, within)
    replica_ipus = [ipus[r * ipus_per_replica:(r + 1) * ipus_per_replica]
                    for ipus in per_instance for r in range(local)]
    leaves = [str(r) for r in range(num_replicas)]
    ipu_cells = [",".join(map(str, ipus)) for ipus in replica_ipus]
    instance_spans = _spans(num_replicas, num_instances)
    ilds = [",".join(str(d) for d in sorted({model.domain_of(i) for i in ipus}))
            for ipus in per_instance]
    merged = [
        ("hosts", list(zip(_spans(num_replicas, len(hosts)), hosts))),
        ("ILDs", list(zip(instance_spans, ilds))),
        ("instances", [(span, str(i)) for i, span in enumerate(instance_spans)]),
    ]
    widths = [max(len(a), len(b)) for a, b in zip(leaves, ipu_cells)]
    for _, cells in merged:
        for (lo, hi), text in cells:
            have = sum(widths[lo:hi]) + 3 * (hi - lo - 1)
            widths[hi - 1] += max(0, len(text) - have)
    label_w = max(len("instances"), len("replicas"))

    def row(label: str, cells: list[tuple[tuple[int, int], str]]) -> str:
        parts = [f"{text:<{sum(widths[lo:hi]) + 3 * (hi - lo - 1)}}" for (lo, hi), text in cells]
        return f"| {label:<{label_w}} | " + " | ".join(parts) + " |"

    lines = [row(label, cells) for label, cells in merged]
    lines.append(row("replicas", [((r, r + 1), t) for r, t in enumerate(leaves)]))
    lines.append(row("IPUs", [((r, r + 1), t) for r, t in enumerate(ipu_cells)]))
    return "\n".join(lines)
