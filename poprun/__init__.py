"""poprun: the ``poprun`` launcher and the PopDist API (``from poprun import popdist``)."""

from poprun import popdist

__all__ = ["popdist"]
