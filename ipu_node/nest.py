"""Nested structures of arrays (tuples, lists, namedtuples, dicts): ``tf.nest``'s job.

A structure's *treedef* is a hashable description of its shape (containers and dict keys, not
the leaves), so two elements have the same structure exactly when their treedefs are equal.
Dict keys are taken in sorted order, as ``tf.nest`` does. The datasets and feeds of
:mod:`ipu_node.execution` and the collectives' nests use it; it is a leaf module (it imports
nothing of ipupod), so that the packages above ``ipu_node`` may share it.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["LEAF", "flatten", "unflatten", "map_structure", "describe", "leaf_paths"]

LEAF = "*"


def flatten(value: Any) -> tuple[list, Any]:
    """``(leaves, treedef)`` of ``value``; leaves in a fixed order (dict keys sorted)."""
    leaves: list = []
    return leaves, _flatten(value, leaves)


def _flatten(value: Any, leaves: list) -> Any:
    if isinstance(value, dict):
        keys = tuple(sorted(value))
        return (dict, keys, tuple(_flatten(value[k], leaves) for k in keys))
    if isinstance(value, (list, tuple)):
        return (type(value), None, tuple(_flatten(v, leaves) for v in value))
    leaves.append(value)
    return LEAF


def unflatten(treedef: Any, leaves: list) -> Any:
    """The structure ``treedef`` with ``leaves`` (in :func:`flatten`'s order) put back."""
    it = iter(leaves)
    out = _build(treedef, it)
    return out


def _build(treedef: Any, it) -> Any:
    if treedef == LEAF:
        return next(it)
    kind, keys, children = treedef
    items = [_build(c, it) for c in children]
    if kind is dict:
        return dict(zip(keys, items))
    if hasattr(kind, "_fields"):  # namedtuple
        return kind(*items)
    return kind(items)


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to every leaf."""
    leaves, treedef = flatten(value)
    return unflatten(treedef, [fn(leaf) for leaf in leaves])


def describe(treedef: Any) -> str:
    """A short readable form of a treedef, for error messages: ``(*, {'x': *})``."""
    if treedef == LEAF:
        return LEAF
    kind, keys, children = treedef
    parts = [describe(c) for c in children]
    if kind is dict:
        return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(keys, parts)) + "}"
    if issubclass(kind, list):
        return "[" + ", ".join(parts) + "]"
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def leaf_paths(value: Any) -> list[str]:
    """Where each leaf of :func:`flatten` sits in ``value``, as index text: ``['w'][0]``."""
    if isinstance(value, dict):
        return [f"[{k!r}]{p}" for k in sorted(value) for p in leaf_paths(value[k])]
    if isinstance(value, (list, tuple)):
        return [f"[{i}]{p}" for i, v in enumerate(value) for p in leaf_paths(v)]
    return [""]
