"""TF_CONFIG: the cluster description of TensorFlow's multi-worker strategies (anchors §4.1).

``{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}``; a
``"chief"`` job, when present, comes first (instance 0), then the workers. An instance
started with TF_CONFIG joins the gRPC transport: its peer server listens at its own address
and instance 0's address serves the job's coordinator (instance 0's peer server then uses a
free port of the same host, announced through the coordinator's peer table).

This module parses and validates text it is given; ``poprun.popdist`` reads the variable.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from launch.errors import LaunchError
from launch.supervise import private_dir

#: jobs that take part in training, in instance order
TRAINING_JOBS = ("chief", "worker")
#: jobs TF clusters may list that do not train: accepted and counted as TF's RunConfig counts
#: them (seed 004:2993-3058: ``num_ps_replicas`` counts ``ps``; an ``evaluator`` is not part
#: of the training cluster); ipupod starts no instance for them (no parameter servers: the
#: strategies allreduce)
OTHER_JOBS = ("ps", "evaluator")


class TFConfigError(ValueError):
    """TF_CONFIG is malformed; the message says what is wrong and where."""


#: seconds a task other than instance 0 waits for instance 0's token file
TOKEN_WAIT_S = 60.0
_TOKEN_POLL_S = 0.05
_HOW_TO_SET = ("set the same secret in IPUPOD_JOB_TOKEN for every task, e.g. "
               "export IPUPOD_JOB_TOKEN=$(python3 -c 'import secrets; "
               "print(secrets.token_hex(16))')")


def _check_address(job: str, i: int, address: Any) -> str:
    if not isinstance(address, str):
        raise TFConfigError(f"TF_CONFIG cluster.{job}[{i}] must be a 'host:port' string, "
                            f"got {address!r}")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TFConfigError(f"TF_CONFIG cluster.{job}[{i}] = {address!r} is not 'host:port' "
                            "with a port in 1..65535")
    return address


@dataclass(frozen=True)
class ClusterSpec:
    """``tf.train.ClusterSpec``, as far as ipupod needs it: job name -> task addresses."""

    jobs_: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def from_dict(cls, cluster: dict[str, list[str]]) -> "ClusterSpec":
        return cls(tuple((job, tuple(tasks)) for job, tasks in cluster.items()))

    def as_dict(self) -> dict[str, list[str]]:
        return {job: list(tasks) for job, tasks in self.jobs_}

    @property
    def jobs(self) -> list[str]:
        return [job for job, _ in self.jobs_]

    def job_tasks(self, job_name: str) -> list[str]:
        """The addresses of ``job_name``'s tasks.

        Raises:
            ValueError: no such job.
        """
        for job, tasks in self.jobs_:
            if job == job_name:
                return list(tasks)
        raise ValueError(f"no job {job_name!r} in the cluster (jobs: {self.jobs})")

    def num_tasks(self, job_name: str) -> int:
        return len(self.job_tasks(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        return self.job_tasks(job_name)[task_index]


@dataclass(frozen=True)
class TFConfig:
    """A parsed, validated TF_CONFIG.

    Attributes:
        cluster: the cluster.
        task_type: ``"chief"`` or ``"worker"``.
        task_index: index within the task's job.
    """

    cluster: ClusterSpec
    task_type: str
    task_index: int

    @property
    def addresses(self) -> list[str]:
        """Every instance's address, in instance order (chief first, then workers)."""
        return [a for job in TRAINING_JOBS if job in self.cluster.jobs
                for a in self.cluster.job_tasks(job)]

    @property
    def num_worker_replicas(self) -> int:
        """RunConfig's count: chief and worker tasks (0 on an evaluator)."""
        return 0 if self.task_type == "evaluator" else len(self.addresses)

    @property
    def num_ps_replicas(self) -> int:
        """RunConfig's count of ``ps`` tasks (0 on an evaluator)."""
        return 0 if self.task_type == "evaluator" else len(
            self.cluster.as_dict().get("ps", []))

    @property
    def is_chief(self) -> bool:
        """RunConfig's rule: the chief task, or worker 0 when the cluster has no chief."""
        if self.task_type == "chief":
            return True
        return (self.task_type == "worker" and self.task_index == 0
                and "chief" not in self.cluster.jobs)

    @property
    def instance_index(self) -> int:
        """This task's instance (chief first, then workers).

        Raises:
            TFConfigError: a ``ps`` or ``evaluator`` task (not an ipupod instance).
        """
        if self.task_type not in TRAINING_JOBS:
            raise TFConfigError(
                f"TF_CONFIG task.type {self.task_type!r}: ipupod runs chief and worker tasks "
                "as instances; ps and evaluator tasks do not train (start only the chief and "
                "workers)")
        offset = 0 if self.task_type == "chief" else len(
            self.cluster.as_dict().get("chief", []))
        return offset + self.task_index

    @property
    def num_instances(self) -> int:
        return len(self.addresses)

    @property
    def coordinator_address(self) -> str:
        """Instance 0's address, where the coordinator listens."""
        return self.addresses[0]

    def token_path(self) -> str:
        """Where instance 0 leaves the job token for the other tasks: a file named after
        the cluster in this user's private directory ``<tmp>/ipupod-tfconfig-<uid>``."""
        text = json.dumps(self.cluster.as_dict(), sort_keys=True)
        name = "cluster-" + hashlib.sha256(text.encode()).hexdigest()[:24] + ".token"
        return os.path.join(tempfile.gettempdir(), f"ipupod-tfconfig-{os.getuid()}", name)


def cluster_token(tf: TFConfig, wait_s: float | None = None) -> str:
    """The job token of a TF_CONFIG cluster started without ``IPUPOD_JOB_TOKEN``: a secret
    (not derivable from the public addresses) that instance 0 creates and writes to
    :meth:`TFConfig.token_path` (0600, in a 0700 directory, owner-checked, ``O_NOFOLLOW``),
    and that the other tasks read from there. This needs the tasks to share that directory
    (one host); elsewhere, set ``IPUPOD_JOB_TOKEN``. Instance 0 removes the file when it
    ends (:func:`remove_cluster_token`).

    Args:
        wait_s: how long another task waits for instance 0's file (default
            :data:`TOKEN_WAIT_S`).

    Raises:
        LaunchError: the directory or file is unsafe, or no token appeared in time (the
            message says how to set one).
    """
    path = tf.token_path()
    private_dir(os.path.dirname(path))
    if tf.instance_index == 0:
        token = secrets.token_hex(16)
        _write_private(path, token)
        return token
    deadline = time.monotonic() + (TOKEN_WAIT_S if wait_s is None else wait_s)
    while True:
        token = _read_private(path)
        if token:
            return token
        if time.monotonic() > deadline:
            raise LaunchError(f"no job token for this TF_CONFIG cluster: instance 0 did not "
                              f"write {path} in time (another host?); {_HOW_TO_SET}")
        time.sleep(_TOKEN_POLL_S)


def remove_cluster_token(tf: TFConfig) -> None:
    """Instance 0, at its end: remove the token file (a later run makes a new secret)."""
    try:
        os.unlink(tf.token_path())
    except OSError:
        pass


def _write_private(path: str, text: str) -> None:
    """``text`` into ``path`` atomically: a new 0600 file beside it, renamed over it."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read_private(path: str) -> str | None:
    """The token in ``path``, or None while there is none.

    Raises:
        LaunchError: the file is a symlink, not a regular file of this user, or readable by
            others.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise LaunchError(f"the job token file {path} {why}; refusing it") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise LaunchError(f"the job token file {path} is not a private file of this user "
                              f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); refusing it")
        return os.read(fd, 4096).decode(errors="replace").strip() or None
    finally:
        os.close(fd)


def parse_tf_config(text: str) -> TFConfig:
    """Parse and validate the text of a TF_CONFIG variable.

    Raises:
        TFConfigError: bad JSON, no or malformed ``cluster``/``task``, an unknown or
            unsupported job, an index out of range, a bad or duplicate address.
    """
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TFConfigError(f"TF_CONFIG is not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise TFConfigError(f"TF_CONFIG must be a JSON object, got {type(record).__name__}")
    cluster = record.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise TFConfigError('TF_CONFIG has no "cluster" object (e.g. {"worker": '
                            '["localhost:12345", "localhost:23456"]})')
    task = record.get("task")
    if not isinstance(task, dict):
        raise TFConfigError('TF_CONFIG has no "task" object (e.g. {"type": "worker", '
                            '"index": 0})')
    for job, tasks in cluster.items():
        if job not in TRAINING_JOBS + OTHER_JOBS:
            raise TFConfigError(f"TF_CONFIG cluster has an unknown job {job!r}; known: "
                                f"{', '.join(TRAINING_JOBS + OTHER_JOBS)}")
        if not isinstance(tasks, list) or not tasks:
            raise TFConfigError(f"TF_CONFIG cluster.{job} must be a non-empty list of "
                                "'host:port' strings")
    if len(cluster.get("chief", [])) > 1:
        raise TFConfigError(f"TF_CONFIG cluster.chief has {len(cluster['chief'])} tasks; "
                            "at most one")
    seen: dict[str, str] = {}
    for job, tasks in cluster.items():
        for i, address in enumerate(tasks):
            _check_address(job, i, address)
            if address in seen:
                raise TFConfigError(f"TF_CONFIG address {address!r} appears twice "
                                    f"({seen[address]} and {job}[{i}])")
            seen[address] = f"{job}[{i}]"
    if not any(job in cluster for job in TRAINING_JOBS):
        raise TFConfigError("TF_CONFIG cluster has no chief or worker task")
    task_type, index = task.get("type"), task.get("index")
    if task_type == "evaluator" and "evaluator" not in cluster and index in (0, None):
        index = 0  # RunConfig: an evaluator need not be listed in the cluster
        return TFConfig(ClusterSpec.from_dict(cluster), task_type, index)
    if task_type not in cluster:
        raise TFConfigError(f"TF_CONFIG task.type {task_type!r} is not a job of the cluster "
                            f"({', '.join(cluster)})")
    if isinstance(index, bool) or not isinstance(index, int):
        raise TFConfigError(f"TF_CONFIG task.index must be an integer, got {index!r}")
    if not 0 <= index < len(cluster[task_type]):
        raise TFConfigError(f"TF_CONFIG task.index {index} is out of range: the "
                            f"{task_type!r} job has {len(cluster[task_type])} tasks")
    return TFConfig(ClusterSpec.from_dict(cluster), task_type, index)


class TFConfigClusterResolver:
    """``tf.distribute.cluster_resolver.TFConfigClusterResolver`` over ipupod's parser.

    Args:
        tf_config: the TF_CONFIG text (``poprun.popdist`` passes the environment's).

    Raises:
        TFConfigError: as :func:`parse_tf_config`.
    """

    def __init__(self, tf_config: str):
        self._config = parse_tf_config(tf_config)

    def cluster_spec(self) -> ClusterSpec:
        return self._config.cluster

    @property
    def task_type(self) -> str:
        return self._config.task_type

    @property
    def task_id(self) -> int:
        return self._config.task_index

    @property
    def rpc_layer(self) -> str:
        return "grpc"

    def master(self, task_type: str | None = None, task_id: int | None = None,
               rpc_layer: str | None = None) -> str:
        """``grpc://host:port`` of a task (default: this one)."""
        address = self._config.cluster.task_address(task_type or self.task_type,
                                                    self.task_id if task_id is None else task_id)
        return f"{rpc_layer or self.rpc_layer}://{address}"

    def num_accelerators(self, *args, **kwargs) -> dict[str, int]:
        return {}

    @property
    def config(self) -> TFConfig:
        """The parsed TF_CONFIG."""
        return self._config


def make_tf_config(addresses: list[str], index: int) -> str:
    """The TF_CONFIG text of worker ``index`` of a cluster of ``addresses``."""
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": "worker", "index": index}})
