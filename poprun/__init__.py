"""poprun: the ``poprun`` launcher, the PopDist API (``from poprun import popdist``) and
``TFConfigClusterResolver``."""

from poprun import popdist
from poprun.cluster_resolver import TFConfigClusterResolver

__all__ = ["popdist", "TFConfigClusterResolver"]
