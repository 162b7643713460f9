"""Flatten and rebuild nested values (dict, list, tuple of arrays/scalars)."""

from __future__ import annotations

from typing import Any, Callable


def flatten(value: Any) -> tuple[list, Callable[[list], Any]]:
    """The leaves of ``value`` in a fixed order (dict keys sorted) and a function that
    rebuilds the same structure from new leaves."""
    if isinstance(value, dict):
        keys = sorted(value)
        parts = [flatten(value[k]) for k in keys]
        return _join(parts, lambda items: dict(zip(keys, items)))
    if isinstance(value, (list, tuple)):
        parts = [flatten(v) for v in value]
        kind = type(value)
        if hasattr(value, "_fields"):  # namedtuple
            return _join(parts, lambda items: kind(*items))
        return _join(parts, lambda items: kind(items))
    return [value], lambda leaves: leaves[0]


def _join(parts, build):
    leaves, sizes, rebuilders = [], [], []
    for part_leaves, rebuild in parts:
        leaves.extend(part_leaves)
        sizes.append(len(part_leaves))
        rebuilders.append(rebuild)

    def unflatten(new_leaves: list) -> Any:
        items, start = [], 0
        for size, rebuild in zip(sizes, rebuilders):
            items.append(rebuild(new_leaves[start:start + size]))
            start += size
        return build(items)

    return leaves, unflatten


def leaf_paths(value: Any) -> list[str]:
    """Where each leaf of :func:`flatten` sits in ``value``, as index text: ``['w'][0]``."""
    if isinstance(value, dict):
        return [f"[{k!r}]{p}" for k in sorted(value) for p in leaf_paths(value[k])]
    if isinstance(value, (list, tuple)):
        return [f"[{i}]{p}" for i, v in enumerate(value) for p in leaf_paths(v)]
    return [""]
