"""TF_CONFIG: parsing and its errors, TFConfigClusterResolver, popdist under TF_CONFIG, and
python -m launch.multiworker running a gRPC job whose worker 0 hosts the coordinator."""

import json
import os
import time

import pytest

from launch.tf_config import TFConfigError, make_tf_config, parse_tf_config
from poprun import TFConfigClusterResolver
from tests.procs import PROGRAMS, PYTHON, ROOT, child_env, run

CLUSTER = {"worker": ["localhost:12345", "localhost:23456", "other:3333"]}


def _cfg(cluster=CLUSTER, task=None):
    return json.dumps({"cluster": cluster, "task": task or {"type": "worker", "index": 1}})


@pytest.mark.parametrize("text, needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), 'no "cluster"'),
    (json.dumps({"cluster": CLUSTER}), 'no "task"'),
    (_cfg(task={"type": "worker", "index": 3}), "task.index 3 is out of range"),
    (_cfg(task={"type": "worker", "index": -1}), "out of range"),
    (_cfg(task={"type": "worker", "index": "0"}), "must be an integer"),
    (_cfg(task={"type": "chief", "index": 0}), "task.type 'chief' is not a job"),
    (_cfg({"worker": ["h:1", "h:1"]}), "'h:1' appears twice"),
    (_cfg({"worker": ["h:1", "nohostport"]}), "cluster.worker[1] = 'nohostport'"),
    (_cfg({"worker": ["h:1", "h:99999"]}), "port in 1..65535"),
    (_cfg({"worker": []}), "non-empty list"),
    (_cfg({"ps": ["h:3"]}, {"type": "ps", "index": 0}), "no chief or worker"),
    (_cfg({"worker": ["h:1", "h:2"], "mystery": ["h:3"]}), "unknown job 'mystery'"),
])
def test_malformed_tf_config_says_what_is_wrong(text, needle):
    with pytest.raises(TFConfigError) as info:
        parse_tf_config(text)
    assert needle in str(info.value)


def test_parse_with_chief_first():
    cfg = parse_tf_config(_cfg({"chief": ["c:1"], "worker": ["w:1", "w:2"]},
                               {"type": "worker", "index": 1}))
    assert cfg.addresses == ["c:1", "w:1", "w:2"]
    assert cfg.instance_index == 2 and cfg.num_instances == 3
    assert cfg.coordinator_address == "c:1"


def test_cluster_resolver():
    resolver = TFConfigClusterResolver(_cfg())
    assert resolver.cluster_spec().as_dict() == CLUSTER
    assert resolver.cluster_spec().num_tasks("worker") == 3
    assert resolver.cluster_spec().job_tasks("worker")[2] == "other:3333"
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.master() == "grpc://localhost:23456"


def test_cluster_resolver_reads_the_environment(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", _cfg(task={"type": "worker", "index": 2}))
    monkeypatch.delenv("POPDIST_NUM_TOTAL_REPLICAS", raising=False)
    assert TFConfigClusterResolver().task_id == 2
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(TFConfigError, match="TF_CONFIG is not set"):
        TFConfigClusterResolver()


def test_popdist_under_tf_config(monkeypatch):
    from ipu_node import IPUConfig
    from poprun import popdist
    for name in ("POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS",
                 "POPDIST_REPLICA_INDEX_OFFSET", "IPUPOD_JOB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_CONFIG", _cfg())
    assert popdist.getNumTotalReplicas() == 3 and popdist.getInstanceIndex() == 1
    from launch.tf_config import _write_private, private_dir, remove_cluster_token
    path = popdist.tf_config().token_path()
    private_dir(os.path.dirname(path))
    _write_private(path, "a-secret-of-instance-0")
    cfg = popdist.set_ipu_config(IPUConfig())
    remove_cluster_token(popdist.tf_config())
    mrd = cfg.experimental.multi_replica_distribution
    assert (mrd.process_count, mrd.process_index, mrd.transport) == (3, 1, "grpc")
    assert mrd.coordinator_address == "localhost:12345"
    assert mrd.listen_address == "localhost:23456"
    assert mrd.job_token == "a-secret-of-instance-0"   # instance 0's, from its file
    monkeypatch.setenv("TF_CONFIG", "{broken")
    with pytest.raises(TFConfigError, match="not valid JSON"):
        popdist.set_ipu_config(IPUConfig())


def _multiworker(n, program, *args, timeout_s=90, **env):
    """``python -m launch.multiworker -n N prog.py args`` (the form the issue documents)."""
    return run([PYTHON, "-m", "launch.multiworker", "-n", str(n), program, *args],
               timeout_s, env=child_env(**env), cwd=ROOT)


@pytest.mark.slow
def test_multiworker_trains_to_the_same_checkpoint_as_poprun(tmp_path):
    from tests.procs import poprun
    result = _multiworker(2, str(PROGRAMS / "train_small.py"), str(tmp_path / "tf"))
    assert result.returncode == 0, result.stderr
    reference = poprun(["-n", "2", "--launcher", "local", "python",
                        str(PROGRAMS / "train_small.py"), str(tmp_path / "poprun")], 90)
    assert reference.returncode == 0, reference.stderr
    blobs = [(tmp_path / d / f"ckpt{i}.bin").read_bytes() for d in ("tf", "poprun")
             for i in range(2)]
    assert len(set(blobs)) == 1


@pytest.mark.slow
def test_multiworker_kill_is_noticed_by_the_survivors(tmp_path):
    start = time.monotonic()
    result = _multiworker(3, str(PROGRAMS / "kill_mid_collective.py"), timeout_s=60,
                          KILL_INSTANCE="1", KILL_TIME_FILE=str(tmp_path / "kill"))
    assert result.returncode != 0
    assert "multiworker: instance 1 failed (killed by SIGKILL)" in result.stderr
    lost = [line.split(" ", 3) for line in result.stdout.splitlines() if "LOST" in line]
    assert lost and all(float(f[2]) < 10 and "instance 1" in f[3] for f in lost), result.stdout
    assert time.monotonic() - start < 30


def test_make_tf_config_round_trip():
    cfg = parse_tf_config(make_tf_config(["a:1", "b:2"], 1))
    assert (cfg.instance_index, cfg.addresses) == (1, ["a:1", "b:2"])


# -- the job token of a cluster without IPUPOD_JOB_TOKEN (issue 11, deliverable 4) -----------

def _tf(index, tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return parse_tf_config(make_tf_config(["localhost:1", "localhost:2"], index))


def test_instance_0_makes_a_secret_that_the_others_read_from_a_private_file(tmp_path,
                                                                            monkeypatch):
    import stat

    from launch.tf_config import cluster_token, remove_cluster_token
    first = cluster_token(_tf(0, tmp_path, monkeypatch))
    path = _tf(0, tmp_path, monkeypatch).token_path()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert cluster_token(_tf(1, tmp_path, monkeypatch), wait_s=1) == first
    assert cluster_token(_tf(0, tmp_path, monkeypatch)) != first   # a secret, not a hash
    remove_cluster_token(_tf(0, tmp_path, monkeypatch))
    assert not os.path.exists(path)


def test_without_instance_0s_file_the_cluster_refuses_and_says_how_to_set_a_token(
        tmp_path, monkeypatch):
    from launch.errors import LaunchError
    from launch.tf_config import cluster_token
    with pytest.raises(LaunchError, match="no job token .* set the same secret in "
                                          "IPUPOD_JOB_TOKEN for every task"):
        cluster_token(_tf(1, tmp_path, monkeypatch), wait_s=0.1)


@pytest.mark.parametrize("plant", ["symlink", "open-file"])
def test_a_planted_token_file_is_refused(tmp_path, monkeypatch, plant):
    from launch.errors import LaunchError
    from launch.tf_config import cluster_token, private_dir
    path = _tf(1, tmp_path, monkeypatch).token_path()
    private_dir(os.path.dirname(path))
    if plant == "symlink":
        (tmp_path / "elsewhere").write_text("attacker-token")
        os.symlink(tmp_path / "elsewhere", path)
    else:
        with open(path, "w") as f:
            f.write("attacker-token")
        os.chmod(path, 0o644)
    with pytest.raises(LaunchError, match="refusing it"):
        cluster_token(_tf(1, tmp_path, monkeypatch), wait_s=0.1)


# the seeds' RunConfig examples (004:2993-3058): chief, ps and evaluator are accepted and
# counted as TF counts them
SEED_CLUSTER = {"chief": ["host0:2222"], "ps": ["host1:2222", "host2:2222"],
                "worker": ["host3:2222", "host4:2222", "host5:2222"]}


@pytest.mark.parametrize("task, index, chief, workers, ps, instance", [
    ({"type": "worker", "index": 1}, 1, False, 4, 2, 2),
    ({"type": "chief", "index": 0}, 0, True, 4, 2, 0),
])
def test_seed_cluster_counts_as_runconfig(task, index, chief, workers, ps, instance):
    cfg = parse_tf_config(json.dumps({"cluster": SEED_CLUSTER, "task": task}))
    assert (cfg.task_index, cfg.is_chief, cfg.num_worker_replicas, cfg.num_ps_replicas) == \
        (index, chief, workers, ps)
    assert cfg.instance_index == instance and cfg.num_instances == 4
    assert cfg.addresses[instance] == {0: "host0:2222", 2: "host4:2222"}[instance]


def test_seed_evaluator_and_ps_tasks_are_not_instances():
    ev = parse_tf_config(json.dumps({"cluster": SEED_CLUSTER,
                                     "task": {"type": "evaluator", "index": 0}}))
    assert (ev.num_worker_replicas, ev.num_ps_replicas, ev.is_chief) == (0, 0, False)
    ps = parse_tf_config(json.dumps({"cluster": SEED_CLUSTER, "task": {"type": "ps",
                                                                      "index": 1}}))
    for cfg in (ev, ps):
        with pytest.raises(TFConfigError, match="ps and evaluator tasks do not train"):
            cfg.instance_index
