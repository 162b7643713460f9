"""Replica groups: GCL's ``CommGroup`` (anchors §2.3; seed 004:5045,5096,5326).

With N replicas and group size k (k must divide N):

* ``ALL``: one group of every replica (size ignored).
* ``CONSECUTIVE``: N/k groups ``{0..k-1}, {k..2k-1}, ...`` (the seeds' rule for
  ``replica_group_size``; the seeds' ``{N-k-1..N-1}`` for the last group is a typo).
* ``ORTHOGONAL``: m = N/k groups ``{0, m, 2m, ...}, {1, m+1, ...}, ..., {m-1, ..., N-1}``.
* ``NONE``: every replica alone.

A size of 0 means the default size of the type: every replica.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import lru_cache


class CommGroupType(enum.Enum):
    ALL = "ALL"
    CONSECUTIVE = "CONSECUTIVE"
    ORTHOGONAL = "ORTHOGONAL"
    NONE = "NONE"


@dataclass(frozen=True)
class CommGroup:
    """A partition of the replicas into groups that communicate.

    Args:
        type: a :class:`CommGroupType`.
        size: replicas per group (0: all replicas).
    """

    type: CommGroupType = CommGroupType.ALL
    size: int = 0

    def __post_init__(self):
        if not isinstance(self.type, CommGroupType):
            raise TypeError(f"CommGroup type must be a CommGroupType, not {self.type!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"CommGroup size must be an int >= 0, got {self.size!r}")

    def members(self, num_replicas: int) -> tuple[tuple[int, ...], ...]:
        """The groups, each a tuple of global replica indices in increasing order.

        Raises:
            ValueError: the group size does not divide ``num_replicas``.
        """
        return _members(self.type, self.size, num_replicas)

    def __str__(self) -> str:
        return f"{self.type.value}({self.size})"


@lru_cache(maxsize=256)
def _members(kind: CommGroupType, size: int, n: int) -> tuple[tuple[int, ...], ...]:
    if kind is CommGroupType.NONE:
        return tuple((r,) for r in range(n))
    k = n if (size == 0 or kind is CommGroupType.ALL) else size
    if k > n or n % k:
        raise ValueError(
            f"replica group size {k} does not divide the number of replicas ({n}); "
            f"choose a size that divides {n}")
    if kind is CommGroupType.ORTHOGONAL:
        m = n // k
        return tuple(tuple(range(g, n, m)) for g in range(m))
    return tuple(tuple(range(s, s + k)) for s in range(0, n, k))


def consecutive(replica_group_size: int | None) -> CommGroup:
    """The group of ``replica_group_size`` (TF-IPU's argument): None means all replicas."""
    if replica_group_size is None:
        return _ALL
    if isinstance(replica_group_size, bool) or not isinstance(replica_group_size, int) \
            or replica_group_size < 1:
        raise ValueError(f"replica_group_size must be an int >= 1 or None, "
                         f"got {replica_group_size!r}")
    return CommGroup(CommGroupType.CONSECUTIVE, replica_group_size)


#: the group of every call without a group argument (one object: cheap to hash and compare)
_ALL = CommGroup(CommGroupType.ALL)
