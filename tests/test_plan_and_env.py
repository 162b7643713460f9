"""Launch plans, the per-instance environment, and the popdist API (pure, no processes)."""

import pytest

from launch import env as names
from launch.plan import make_plan, plan_replicas
from poprun import popdist


@pytest.mark.parametrize("instances, replicas, offsets, local", [
    (1, 1, [0], 1),
    (1, 4, [0], 4),
    (2, 4, [0, 2], 2),
    (4, 4, [0, 1, 2, 3], 1),
    (4, 8, [0, 2, 4, 6], 2),
    (3, 12, [0, 4, 8], 4),
])
def test_replicas_split_evenly_and_in_order(instances, replicas, offsets, local):
    placements = plan_replicas(instances, replicas)
    assert [p.replica_index_offset for p in placements] == offsets
    assert {p.num_local_replicas for p in placements} == {local}
    assert [p.index for p in placements] == list(range(instances))
    covered = [r for p in placements for r in p.replicas]
    assert covered == list(range(replicas))


@pytest.mark.parametrize("instances, replicas, message", [
    (3, 4, "--num-replicas (4) must be divisible by --num-instances (3)"),
    (0, 4, "--num-instances must be a positive integer"),
    (2, -2, "--num-replicas must be a positive integer"),
])
def test_bad_counts_are_refused_with_the_numbers(instances, replicas, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_replicas(instances, replicas)


def test_plan_needs_a_program_and_defaults_replicas_to_instances():
    with pytest.raises(ValueError, match="no program"):
        make_plan([], 2)
    plan = make_plan(["python", "x.py"], 3)
    assert plan.num_replicas == 3 and len(plan.instances) == 3
    with pytest.raises(ValueError, match="--ipus-per-replica"):
        make_plan(["python", "x.py"], 1, 1, ipus_per_replica=0)


def test_instance_env_for_two_instances_four_replicas_two_ipus_each():
    plan = make_plan(["python", "x.py"], 2, 4, 2, job_id="job1")
    envs = [names.instance_env(plan, p) for p in plan.instances]
    for i, env in enumerate(envs):
        assert env[names.NUM_TOTAL_REPLICAS] == "4"
        assert env[names.NUM_IPUS_PER_REPLICA] == "2"
        assert env[names.NUM_LOCAL_REPLICAS] == "2"
        assert env[names.UNIFORM_REPLICAS_PER_INSTANCE] == "1"
        assert env[names.REPLICA_INDEX_OFFSET] == str(2 * i)
        assert env[names.LOCAL_INSTANCE_INDEX] == str(i)
        assert env[names.INSTANCE_INDEX] == str(i)
        assert env[names.NUM_INSTANCES] == "2"
        assert env[names.JOB_ID] == "job1"
        assert env[names.TRANSPORT] == "mpi"


_ALL_VARS = [names.NUM_TOTAL_REPLICAS, names.NUM_IPUS_PER_REPLICA, names.NUM_LOCAL_REPLICAS,
             names.REPLICA_INDEX_OFFSET, names.LOCAL_INSTANCE_INDEX, names.TRANSPORT,
             names.NUM_INSTANCES, names.INSTANCE_INDEX, *names.MPI_RANK_VARS, *names.MPI_SIZE_VARS, *names.MPI_LOCAL_RANK_VARS]


@pytest.fixture
def clean_env(monkeypatch):
    for var in _ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_popdist_defaults_when_started_alone(clean_env):
    assert not popdist.isPopdistEnvSet()
    assert (popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(),
            popdist.getReplicaIndexOffset(), popdist.getNumIpusPerReplica(),
            popdist.getNumInstances(), popdist.getInstanceIndex(),
            popdist.getLocalInstanceIndex()) == (1, 1, 0, 1, 1, 0, 0)


@pytest.mark.parametrize("rank_var, size_var", [("PMI_RANK", "PMI_SIZE"),
                                                ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")])
def test_popdist_under_plain_mpirun_is_one_replica_per_rank(clean_env, rank_var, size_var):
    clean_env.setenv(rank_var, "2")
    clean_env.setenv(size_var, "3")
    assert not popdist.isPopdistEnvSet()
    assert popdist.getNumTotalReplicas() == 3
    assert popdist.getNumInstances() == 3
    assert popdist.getInstanceIndex() == 2
    assert popdist.getReplicaIndexOffset() == 2


def test_popdist_reads_poprun_env_and_configures_ipus(clean_env):
    import ipu_node
    for k, v in {names.NUM_TOTAL_REPLICAS: "8", names.NUM_LOCAL_REPLICAS: "2",
                 names.REPLICA_INDEX_OFFSET: "4", names.NUM_IPUS_PER_REPLICA: "2",
                 names.LOCAL_INSTANCE_INDEX: "2"}.items():
        clean_env.setenv(k, v)
    assert popdist.isPopdistEnvSet()
    assert popdist.getNumInstances() == 4 and popdist.getInstanceIndex() == 2
    cfg = popdist.set_ipu_config(ipu_node.IPUConfig(), ipus_per_replica=2)
    assert cfg.auto_select_ipus == 4 and cfg.ipus_per_replica == 2
    mrd = cfg.experimental.multi_replica_distribution
    assert (mrd.process_count, mrd.process_index) == (4, 2)
    with pytest.raises(ValueError, match="--ipus-per-replica 2"):
        popdist.set_ipu_config(ipu_node.IPUConfig(), ipus_per_replica=1)


def test_ipu_node_reads_the_share_poprun_gave_without_popdist(clean_env):
    # what hvd.init() configures in a program that never imports popdist: the same config as
    # popdist.set_ipu_config makes, read by ipu_node from poprun's variables (nothing
    # registers itself with ipu_node)
    import ipu_node
    from ipu_node.runtime.launched import launched_config
    assert launched_config() is None   # not started by poprun
    for k, v in {names.NUM_TOTAL_REPLICAS: "8", names.NUM_LOCAL_REPLICAS: "2",
                 names.REPLICA_INDEX_OFFSET: "4", names.NUM_IPUS_PER_REPLICA: "2",
                 names.TRANSPORT: "grpc", names.COORDINATOR_ADDRESS: "127.0.0.1:5000",
                 names.JOB_TOKEN: "t0ken"}.items():
        clean_env.setenv(k, v)
    got = launched_config()
    want = popdist.set_ipu_config(ipu_node.IPUConfig(), ipus_per_replica=2)
    assert (got.auto_select_ipus, got.ipus_per_replica) == (4, 2) == \
        (want.auto_select_ipus, want.ipus_per_replica)
    mine, theirs = (c.experimental.multi_replica_distribution for c in (got, want))
    assert (mine.process_count, mine.process_index, mine.transport, mine.coordinator_address,
            mine.job_token) == (4, 2, "grpc", "127.0.0.1:5000", "t0ken") == \
        (theirs.process_count, theirs.process_index, theirs.transport,
         theirs.coordinator_address, theirs.job_token)
    clean_env.setenv(names.NUM_INSTANCES, "3")
    with pytest.raises(ValueError, match="IPUPOD_NUM_INSTANCES=3 in the environment poprun "
                                         "gave this instance disagrees"):
        launched_config()


def test_popdist_rejects_a_garbled_variable(clean_env):
    clean_env.setenv(names.NUM_TOTAL_REPLICAS, "four")
    with pytest.raises(ValueError, match="POPDIST_NUM_TOTAL_REPLICAS='four'"):
        popdist.getNumTotalReplicas()


def test_report_dir_reaches_every_instance():
    from dataclasses import replace

    from launch.env import REPORT_DIR, instance_env
    from poprun.options import build_parser, parse_args
    plan = make_plan(["python", "x.py"], 2)
    assert REPORT_DIR not in instance_env(plan, plan.instances[0])
    plan = replace(plan, report_dir="/tmp/reports")
    assert all(instance_env(plan, p)[REPORT_DIR] == "/tmp/reports" for p in plan.instances)
    args, program = parse_args(build_parser(), ["--report-dir", "out", "python", "x.py"])
    assert (args.report_dir, program) == ("out", ["python", "x.py"])
