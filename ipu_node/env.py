"""The one place where :mod:`ipu_node` reads the environment.

Names are constants so launchers (poprun, the mpirun path) can set them without spelling them
again. Every value is read when a function below is called, never at import time.

* ``IPUPOD_SYSTEM``: the emulated system (``C2-16``, ``POD4``, ``POD16``, ``POD64``,
  ``POD128``, ``POD256``); :data:`DEFAULT_SYSTEM` when unset. poprun passes ``--system`` on to
  every instance through it.
* ``IPUPOD_OCCUPANCY_DIR``: directory of the IPU lock files shared by the processes of one
  machine (default ``$XDG_RUNTIME_DIR/ipupod`` or ``/tmp/ipupod-<uid>``); tests point it at a
  fresh temporary directory.
* ``IPUPOD_PARTITION_IPUS``: the IPU ids poprun reserved for the job (``"8,9,10,11"``); the
  instances attach their IPUs inside it.
* ``IPUPOD_REPORT_DIR``: where the run reports go (``poprun --report-dir``); see
  :func:`ipu_node.flags.report_directory`.
* ``IPUPOD_JOB_ID``: the job an instance belongs to. All instances of one job share one
  partition (an occupancy scope of their own); processes without it share the machine's scope.
* ``POPDIST_*`` (Graphcore poprun's names, anchors §1.2) and ``IPUPOD_NUM_INSTANCES``,
  ``IPUPOD_INSTANCE_INDEX``, ``IPUPOD_TRANSPORT``, ``IPUPOD_COORDINATOR_ADDRESS``,
  ``IPUPOD_JOB_TOKEN``, ``IPUPOD_LISTEN_ADDRESS``: an instance's share of a poprun job
  (written by ``launch.env``), read here with :func:`env_int` or raw, and put together by
  :mod:`ipu_node.runtime.launched`.
* Graphcore's own variables, read raw here and parsed by :mod:`ipu_node.flags`:
  ``TF_POPLAR_FLAGS``, ``POPLAR_ENGINE_OPTIONS``, ``POPLAR_LOG_LEVEL``, ``POPLAR_LOG_DEST``,
  ``POPLIBS_LOG_LEVEL``.
"""

from __future__ import annotations

import os
import tempfile

#: Environment variable naming the emulated system.
IPUPOD_SYSTEM = "IPUPOD_SYSTEM"
#: Environment variable overriding the directory of the IPU lock files.
IPUPOD_OCCUPANCY_DIR = "IPUPOD_OCCUPANCY_DIR"
#: Environment variable naming the job (set by launchers for every instance of a job).
IPUPOD_JOB_ID = "IPUPOD_JOB_ID"

#: Environment variable naming the directory of every run report of the instance (poprun's
#: ``--report-dir`` sets it; read by :func:`ipu_node.flags.report_directory`).
IPUPOD_REPORT_DIR = "IPUPOD_REPORT_DIR"

#: Environment variable with the IPU ids of the job's partition (poprun sets it).
IPUPOD_PARTITION_IPUS = "IPUPOD_PARTITION_IPUS"

#: An instance's share of a poprun job (Graphcore's names, anchors §1.2): the job's replicas,
#: this instance's, the global index of its first, the IPUs of a replica, and the instance's
#: index among those of its host.
POPDIST_NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
POPDIST_NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
POPDIST_REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
POPDIST_NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
POPDIST_LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"
#: ipupod's: the job's instances and this one's index (poprun checks them against the
#: POPDIST_* values), the transport, and for the grpc transport the coordinator's address,
#: the job's token (a secret) and where this instance's peer server listens.
IPUPOD_NUM_INSTANCES = "IPUPOD_NUM_INSTANCES"
IPUPOD_INSTANCE_INDEX = "IPUPOD_INSTANCE_INDEX"
IPUPOD_TRANSPORT = "IPUPOD_TRANSPORT"
IPUPOD_COORDINATOR_ADDRESS = "IPUPOD_COORDINATOR_ADDRESS"
IPUPOD_JOB_TOKEN = "IPUPOD_JOB_TOKEN"
IPUPOD_LISTEN_ADDRESS = "IPUPOD_LISTEN_ADDRESS"

#: TF-IPU's flags (seed 002:111-115, 000:236, 001:487).
TF_POPLAR_FLAGS = "TF_POPLAR_FLAGS"
#: Poplar's engine options as JSON (seed 000:255, 001:877-882).
POPLAR_ENGINE_OPTIONS = "POPLAR_ENGINE_OPTIONS"
#: Log level and destination of the emulated Poplar layer, and of the PopLibs layer (seed
#: 001:495-499, 855-864).
POPLAR_LOG_LEVEL = "POPLAR_LOG_LEVEL"
POPLAR_LOG_DEST = "POPLAR_LOG_DEST"
POPLIBS_LOG_LEVEL = "POPLIBS_LOG_LEVEL"

#: The system used when neither an argument nor ``IPUPOD_SYSTEM`` names one.
DEFAULT_SYSTEM = "POD16"


def system_name(explicit: str | None = None) -> str:
    """The system name: ``explicit`` if given and non-empty, else ``$IPUPOD_SYSTEM``, else POD16."""
    if explicit:
        return explicit
    return os.environ.get(IPUPOD_SYSTEM) or DEFAULT_SYSTEM


def occupancy_dir() -> str:
    """Root directory of the IPU lock files (not created here)."""
    explicit = os.environ.get(IPUPOD_OCCUPANCY_DIR)
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        return os.path.join(runtime, "ipupod")
    return os.path.join(tempfile.gettempdir(), f"ipupod-{os.getuid()}")


def env_int(name: str) -> int | None:
    """The integer in environment variable ``name``, or None when it is unset or empty.

    Raises:
        ValueError: it holds something else (names the variable and its text).
    """
    text = os.environ.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None


def raw(name: str) -> str:
    """The text of environment variable ``name`` ('' when unset)."""
    return os.environ.get(name, "")


#: Rank and size of a program started by plain ``mpirun`` (Open MPI's and MPICH's names).
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def mpi_world() -> tuple[int, int] | None:
    """``(rank, size)`` of a program started by ``mpirun`` (``OMPI_COMM_WORLD_*`` or
    ``PMI_*``), or None. Variables that are not integers count as absent."""
    def first(names: tuple[str, ...]) -> int | None:
        for name in names:
            try:
                return int(os.environ[name])
            except (KeyError, ValueError):
                continue
        return None
    rank, size = first(MPI_RANK_VARS), first(MPI_SIZE_VARS)
    return None if rank is None or size is None else (rank, size)


def job_id() -> str | None:
    """The job id of this process (``$IPUPOD_JOB_ID``), or None outside a launched job."""
    return os.environ.get(IPUPOD_JOB_ID) or None


def partition_ipus() -> tuple[int, ...] | None:
    """The IPU ids of this job's partition (``$IPUPOD_PARTITION_IPUS``), or None.

    Raises:
        ValueError: the variable is not a comma-separated list of IPU ids.
    """
    raw = os.environ.get(IPUPOD_PARTITION_IPUS, "").strip()
    if not raw:
        return None
    try:
        return tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise ValueError(f"{IPUPOD_PARTITION_IPUS}={raw!r} is not a comma-separated list of "
                         "IPU ids") from None


def report_dir() -> str:
    """``$IPUPOD_REPORT_DIR``, or "" when unset."""
    return os.environ.get(IPUPOD_REPORT_DIR, "")
