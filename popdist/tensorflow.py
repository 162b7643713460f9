"""``popdist.tensorflow``: configure an ``IPUConfig`` for this instance's share of the job
(Graphcore's ``popdist.tensorflow.set_ipu_config``, anchors §1.3)."""

from __future__ import annotations

from poprun import popdist as _popdist

__all__ = ["set_ipu_config"]


def set_ipu_config(config, ipus_per_replica: int, configure_device: bool = True):
    """Set ``config`` (an ``ipu_node.IPUConfig``) up for this instance: replicas, IPUs per
    replica, and the multi-replica distribution (process count and index, transport); with
    ``configure_device`` also which IPUs it attaches (``auto_select_ipus``: the IPUs of the
    local replicas), else the device selection is left as it was.

    Returns:
        ``config``.

    Raises:
        ValueError: ``ipus_per_replica`` differs from poprun's ``--ipus-per-replica``.
        TFConfigError, LaunchError: as :func:`poprun.popdist.set_ipu_config`.
    """
    selection = config.auto_select_ipus
    _popdist.set_ipu_config(config, ipus_per_replica=ipus_per_replica)
    if not configure_device:
        config.auto_select_ipus = selection
    return config
