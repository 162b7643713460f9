"""``TFConfigClusterResolver``: the cluster of a TF_CONFIG job, as TensorFlow names it.

    resolver = TFConfigClusterResolver()       # reads TF_CONFIG (seed 004:1991)
    resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id
"""

from __future__ import annotations

from launch import tf_config as _tf
from launch.tf_config import ClusterSpec, TFConfigError
from poprun import popdist


class TFConfigClusterResolver(_tf.TFConfigClusterResolver):
    """Resolves the cluster from the ``TF_CONFIG`` environment variable (or ``tf_config``).

    Raises:
        TFConfigError: TF_CONFIG is unset or malformed (says what is wrong).
    """

    def __init__(self, tf_config: str | None = None):
        text = tf_config if tf_config is not None else popdist.tf_config_text()
        if text is None:
            raise TFConfigError("TF_CONFIG is not set: start the program with "
                                "python -m launch.multiworker, or set TF_CONFIG")
        super().__init__(text)

    def update_ipu_config(self, config):
        """ipupod: fill ``config``'s ``experimental.multi_replica_distribution`` with this
        cluster's workers (process count and index, the grpc transport, the coordinator
        that instance 0 hosts), as ``popdist.set_ipu_config`` does, unless it is set
        already. ``IPUMultiWorkerStrategy(resolver)`` made before the IPU system calls it
        when the program configures one (seed 004:1991-2058). Returns ``config``."""
        mrd = config.experimental.multi_replica_distribution
        if mrd.process_count == 0:
            popdist._configure_tf_cluster(mrd, self.config)
        return config


__all__ = ["TFConfigClusterResolver", "ClusterSpec", "TFConfigError"]
