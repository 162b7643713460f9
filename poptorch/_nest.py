"""Nested structures (tuples, lists, dicts, named tuples) of tensors: flatten and rebuild."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["flatten"]


def flatten(structure: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The leaves of ``structure`` in order, and ``rebuild(leaves)`` that puts new leaves
    into the same structure (tuple, list, dict by key order, named tuple; anything else is a
    leaf)."""
    leaves: list[Any] = []
    spec = _spec(structure, leaves)
    return leaves, lambda new: _build(spec, iter(new))


def _spec(node: Any, leaves: list) -> Any:
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return ("namedtuple", type(node), [_spec(v, leaves) for v in node])
    if isinstance(node, (tuple, list)):
        return (type(node).__name__, None, [_spec(v, leaves) for v in node])
    if isinstance(node, dict):
        return ("dict", type(node), [(k, _spec(v, leaves)) for k, v in node.items()])
    leaves.append(node)
    return None


def _build(spec: Any, leaves) -> Any:
    if spec is None:
        return next(leaves)
    kind, cls, children = spec
    if kind == "namedtuple":
        return cls(*[_build(c, leaves) for c in children])
    if kind == "tuple":
        return tuple(_build(c, leaves) for c in children)
    if kind == "list":
        return [_build(c, leaves) for c in children]
    built = [(k, _build(c, leaves)) for k, c in children]
    try:
        return cls(built)
    except TypeError:
        return dict(built)
