"""The environment contract between the launcher and each instance: every name, and the one
function that builds an instance's variables.

``POPDIST_*`` are Graphcore poprun's names (anchors §1.2); ``IPUPOD_*`` are ipupod's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launch.plan import InstancePlacement, LaunchPlan

NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
UNIFORM_REPLICAS_PER_INSTANCE = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"

INSTANCE_INDEX = "IPUPOD_INSTANCE_INDEX"
NUM_INSTANCES = "IPUPOD_NUM_INSTANCES"
TRANSPORT = "IPUPOD_TRANSPORT"
JOB_ID = "IPUPOD_JOB_ID"          # read by ipu_node.env (the job's IPU partition)
SYSTEM = "IPUPOD_SYSTEM"          # read by ipu_node.env (the emulated POD)
PARTITION_IPUS = "IPUPOD_PARTITION_IPUS"  # read by ipu_node.env (the job's reserved IPUs)
ERROR_FILE = "IPUPOD_ERROR_FILE"
# The grpc transport: where the coordinator listens, the token every call carries, and
# (optional) where the instance's own peer server listens (default 127.0.0.1:0).
COORDINATOR_ADDRESS = "IPUPOD_COORDINATOR_ADDRESS"
JOB_TOKEN = "IPUPOD_JOB_TOKEN"
LISTEN_ADDRESS = "IPUPOD_LISTEN_ADDRESS"
HEARTBEAT_TIMEOUT = "IPUPOD_HEARTBEAT_TIMEOUT_S"  # read by the coordinator and collectives
# Set by poprun's local launcher: the instance dies with it (bootstrap sets PR_SET_PDEATHSIG).
PARENT_PID = "IPUPOD_PARENT_PID"

# TensorFlow's cluster description (anchors §4.1), read by poprun.popdist.
TF_CONFIG = "TF_CONFIG"

# A program started by plain mpirun (no poprun): rank and size (anchors §1.2).
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
MPI_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def instance_env(plan: "LaunchPlan", placement: "InstancePlacement",
                 error_file: str | None = None) -> dict[str, str]:
    """The variables instance ``placement.index`` of ``plan`` starts with (not os.environ)."""
    env = {
        NUM_TOTAL_REPLICAS: str(plan.num_replicas),
        NUM_IPUS_PER_REPLICA: str(plan.ipus_per_replica),
        NUM_LOCAL_REPLICAS: str(placement.num_local_replicas),
        UNIFORM_REPLICAS_PER_INSTANCE: "1",
        REPLICA_INDEX_OFFSET: str(placement.replica_index_offset),
        LOCAL_INSTANCE_INDEX: str(placement.local_instance_index),
        INSTANCE_INDEX: str(placement.index),
        NUM_INSTANCES: str(plan.num_instances),
        TRANSPORT: plan.transport,
        JOB_ID: plan.job_id,
    }
    if plan.system:
        env[SYSTEM] = plan.system
    if plan.partition_ipus:
        env[PARTITION_IPUS] = ",".join(str(i) for i in plan.partition_ipus)
    if plan.coordinator_address:
        env[COORDINATOR_ADDRESS] = plan.coordinator_address
    if plan.job_token:
        env[JOB_TOKEN] = plan.job_token
    if error_file:
        env[ERROR_FILE] = error_file
    return env
