"""TF_CONFIG: the cluster description of TensorFlow's multi-worker strategies (anchors §4.1).

``{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}``; a
``"chief"`` job, when present, comes first (instance 0), then the workers. An instance
started with TF_CONFIG joins the gRPC transport: its peer server listens at its own address
and instance 0's address serves the job's coordinator (instance 0's peer server then uses a
free port of the same host, announced through the coordinator's peer table).

This module parses and validates text it is given; ``poprun.popdist`` reads the variable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

#: jobs that take part in training, in instance order
TRAINING_JOBS = ("chief", "worker")
#: jobs TF clusters may list that do not train: accepted and counted as TF's RunConfig counts
#: them (seed 004:2993-3058: ``num_ps_replicas`` counts ``ps``; an ``evaluator`` is not part
#: of the training cluster); ipupod starts no instance for them (no parameter servers: the
#: strategies allreduce)
OTHER_JOBS = ("ps", "evaluator")


class TFConfigError(ValueError):
    """TF_CONFIG is malformed; the message says what is wrong and where."""


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

    def default_token(self) -> str:
        """A job token derived from the cluster (every instance computes the same): it keeps
        other clusters' calls out, but is no secret; set IPUPOD_JOB_TOKEN for one."""
        text = json.dumps(self.cluster.as_dict(), sort_keys=True)
        return "tfconfig-" + hashlib.sha256(text.encode()).hexdigest()[:24]


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
