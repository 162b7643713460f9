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
# --executable-cache-path: the variable Graphcore's frameworks read (graphcore/tensorflow
# poplar_executable_cache: ``std::getenv("POPDIST_EXECUTABLE_CACHE_PATH")``).
EXECUTABLE_CACHE_PATH = "POPDIST_EXECUTABLE_CACHE_PATH"
# What Graphcore's poprun passes about the V-IPU partition (anchors §1.2, its -vv log).
VIPU_API_HOST = "IPUOF_VIPU_API_HOST"
VIPU_API_PORT = "IPUOF_VIPU_API_PORT"
VIPU_API_PARTITION_ID = "IPUOF_VIPU_API_PARTITION_ID"
VIPU_API_TIMEOUT = "IPUOF_VIPU_API_TIMEOUT"

INSTANCE_INDEX = "IPUPOD_INSTANCE_INDEX"
NUM_INSTANCES = "IPUPOD_NUM_INSTANCES"
TRANSPORT = "IPUPOD_TRANSPORT"
JOB_ID = "IPUPOD_JOB_ID"          # read by ipu_node.env (the job's IPU partition)
SYSTEM = "IPUPOD_SYSTEM"          # read by ipu_node.env (the emulated POD)
PARTITION_IPUS = "IPUPOD_PARTITION_IPUS"  # read by ipu_node.env (the job's reserved IPUs)
ERROR_FILE = "IPUPOD_ERROR_FILE"
REPORT_DIR = "IPUPOD_REPORT_DIR"  # read by ipu_node.env (poprun --report-dir)
# The grpc transport: where the coordinator listens, the token every call carries, and
# (optional) where the instance's own peer server listens (default 127.0.0.1:0).
COORDINATOR_ADDRESS = "IPUPOD_COORDINATOR_ADDRESS"
JOB_TOKEN = "IPUPOD_JOB_TOKEN"
LISTEN_ADDRESS = "IPUPOD_LISTEN_ADDRESS"
HEARTBEAT_TIMEOUT = "IPUPOD_HEARTBEAT_TIMEOUT_S"  # read by the coordinator and collectives
# Set by poprun's local launcher: the instance dies with it (bootstrap sets PR_SET_PDEATHSIG).
PARENT_PID = "IPUPOD_PARENT_PID"
# Set in an instance of a test job (poprun.testing) while it runs its test: there, a test
# marked @pytest.mark.poprun runs as it is instead of starting a job of its own.
PYTEST_JOB = "IPUPOD_PYTEST_JOB"

#: Variables that are secrets: never on a command line (mpirun gets them through its own
#: environment, which Hydra propagates to every instance), never in a log.
SECRET_NAMES = frozenset({JOB_TOKEN})

# TensorFlow's cluster description (anchors §4.1), read by poprun.popdist.
TF_CONFIG = "TF_CONFIG"

# A program started by plain mpirun (no poprun): rank and size (anchors §1.2).
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
MPI_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def instance_env(plan: "LaunchPlan", placement: "InstancePlacement",
                 error_file: str | None = None) -> dict[str, str]:
    """The variables instance ``placement.index`` of ``plan`` starts with (not os.environ):
    :func:`job_env` and :func:`placement_env`."""
    return {**job_env(plan), **placement_env(plan, placement, error_file)}


def placement_env(plan: "LaunchPlan", placement: "InstancePlacement",
                  error_file: str | None = None) -> dict[str, str]:
    """The variables that differ between the instances of ``plan`` (none of them secret):
    replica offset, local instance index, instance index, error file, and the extra
    variables of ``--mpi-local-args``/``--instance-mpi-local-args``."""
    env = {
        **plan.extra_env_of(placement.index),
        NUM_LOCAL_REPLICAS: str(placement.num_local_replicas),
        REPLICA_INDEX_OFFSET: str(placement.replica_index_offset),
        LOCAL_INSTANCE_INDEX: str(placement.local_instance_index),
        INSTANCE_INDEX: str(placement.index),
    }
    if plan.transport == "grpc" and plan.remote_hosts:
        # across hosts, each instance's peer server listens on its host's address (the
        # name poprun was given for it), not on loopback
        env[LISTEN_ADDRESS] = f"{placement.host}:0"
    if error_file:
        env[ERROR_FILE] = error_file
    return env


def job_env(plan: "LaunchPlan") -> dict[str, str]:
    """The variables every instance of ``plan`` gets alike, the job token among them (the
    ``POPDIST_*`` names Graphcore's poprun sets, anchors §1.2, then ipupod's ``IPUPOD_*``)."""
    env = {
        **dict(plan.job_env),
        NUM_TOTAL_REPLICAS: str(plan.num_replicas),
        NUM_IPUS_PER_REPLICA: str(plan.ipus_per_replica),
        UNIFORM_REPLICAS_PER_INSTANCE: "1",
        NUM_INSTANCES: str(plan.num_instances),
        TRANSPORT: plan.transport,
        JOB_ID: plan.job_id,
    }
    if plan.system:
        env[SYSTEM] = plan.system
    if plan.report_dir:
        env[REPORT_DIR] = plan.report_dir
    if plan.partition_ipus:
        env[PARTITION_IPUS] = ",".join(str(i) for i in plan.partition_ipus)
    if plan.coordinator_address:
        env[COORDINATOR_ADDRESS] = plan.coordinator_address
    if plan.job_token:
        env[JOB_TOKEN] = plan.job_token
    return env
