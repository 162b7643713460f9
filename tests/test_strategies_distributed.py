"""The seeds' strategies and their variable semantics (seed 004:1962-1977): in this process
(IPUStrategy, several local replicas) and across instances under each launcher
(tests/programs/strategy_semantics.py writes one JSON file of evidence per instance; under
poprun, ``poprun.testing.run_job`` returns it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from poprun.testing import run_job
from tests.procs import PROGRAMS, PYTHON, ROOT, child_env, run
from tests.programs import strategy_semantics

PROG = str(PROGRAMS / "strategy_semantics.py")
MPIRUN = str(Path(PYTHON).parent / "mpirun")


def evidence(cmd: list[str], directory: Path) -> list[dict]:
    job = run(cmd, timeout_s=120, env=child_env(STRATEGY_EVIDENCE_DIR=str(directory)),
              cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr
    found = [json.loads(p.read_text()) for p in sorted(directory.glob("instance_*.json"))]
    assert [e["instance"] for e in found] == [0, 1], job.stdout + job.stderr
    return found


def check_common(found: list[dict], replicas: int) -> None:
    lr, grads = 0.5, sum(r + 1.0 for r in range(replicas))  # replica r's gradient is r + 1
    for e in found:
        assert e["initial"] == [10.0] * 3  # worker 0's initial value everywhere
        assert e["after_step"] == [[10.0 - lr * grads] * 3] * (replicas // 2)  # a SUM
        assert e["count"] == grads  # sync-on-read SUM over every replica, read by all
        # read by worker 0 only: every worker raises, naming the variable
        assert "sync-on-read Variable 'count'" in e["one_reader"], e["one_reader"]
        assert e["after_error"] == replicas  # usable afterwards


@pytest.mark.slow
def test_multiworker_strategy_over_grpc_from_tf_config(tmp_path):
    found = evidence([PYTHON, "-m", "launch.multiworker", "-n", "2", PROG, "multiworker"],
                     tmp_path)
    check_common(found, 2)
    assert all(e["sram"] == 12 and e["loss"] == 3.0 for e in found)  # 3 float32 on the IPU


@pytest.mark.slow
def test_horovod_strategy_under_mpirun_with_variables_on_host(tmp_path):
    found = evidence([MPIRUN, "-n", "2", PYTHON, PROG, "horovod", "--on-host"], tmp_path)
    check_common(found, 2)
    for e in found:
        assert e["sram"] == 0  # on the host: nothing in IPU SRAM
        assert e["host_step"] == [8.5 - 0.5 * 3.0] * 3  # host gradients summed over workers
        assert e["host_io"] >= 1  # modelled host transfers charged


@pytest.mark.slow
def test_popdist_strategy_under_poprun_with_two_replicas_per_instance():
    found = run_job(strategy_semantics.main, "popdist", False, num_instances=2,
                    num_replicas=4, timeout=120)
    assert [e["instance"] for e in found] == [0, 1]
    check_common(found, 4)
    assert all(e["sram"] == 24 and e["loss"] == 6.0 for e in found)


@pytest.fixture
def two_replicas(local_system):
    local_system(2)   # (conftest: a system of two 1-IPU replicas, reset afterwards)


def test_ipu_strategy_mirrored_and_sync_on_read_in_one_instance(two_replicas):
    from collectives.strategies import (IPUStrategy, ReduceOp, VariableAggregation,
                                        VariableSynchronization)
    from ipu_node.optimizers import MomentumOptimizer
    strategy = IPUStrategy()
    with strategy.scope():
        w = strategy.Variable(np.ones(2), name="w")
        mean = strategy.Variable(np.float64(0), name="m",
                                 synchronization=VariableSynchronization.ON_READ,
                                 aggregation=VariableAggregation.MEAN)
        first = strategy.Variable(np.float64(0), name="f",
                                  synchronization=VariableSynchronization.ON_READ,
                                  aggregation=VariableAggregation.ONLY_FIRST_REPLICA)
        opt = MomentumOptimizer(0.1, 0.9)

        def step(g):
            opt.apply_gradients([(g, w)])
            mean.assign(g[0])
            first.assign(g[0])
            return w.value.copy()

        from collectives.strategies import PerReplica
        out = strategy.experimental_run_v2(step, args=(PerReplica([np.ones(2),
                                                                   3 * np.ones(2)]),))
    np.testing.assert_allclose(out, [[0.6, 0.6]] * 2)  # 1 - 0.1 * (1 + 3)
    assert (float(mean.value), float(first.value)) == (2.0, 1.0)
    assert strategy.reduce(ReduceOp.MEAN, [1.0, 3.0]) == 2.0
    with pytest.raises(ValueError, match="needs an aggregation"):
        strategy.Variable(0.0, synchronization=VariableSynchronization.ON_READ)
    with pytest.raises(ValueError, match="host code"):
        strategy.run(lambda: strategy.Variable(0.0))


def test_update_ipu_config_and_variables_on_host_in_one_instance(two_replicas):
    import ipu_node
    from collectives.strategies import IPUStrategy, PopDistStrategy
    strategy = PopDistStrategy(variables_on_host=True)
    cfg = strategy.update_ipu_config(ipu_node.IPUConfig())
    mrd = cfg.experimental.multi_replica_distribution
    assert (mrd.process_count, mrd.process_index) == (0, 0)
    system = ipu_node.get_system()
    before = sum(m.in_use_bytes for m in system.memory.values())
    with strategy.scope():
        strategy.Variable(np.ones(1000, np.float32), name="big")
    assert sum(m.in_use_bytes for m in system.memory.values()) == before  # on the host
    with IPUStrategy().scope() as s:
        # the layout is still derived (ipus_per_replica unset): each replica places its
        # copy when it first uses it
        v = s.Variable(np.ones(1000, np.float32), name="big")
        assert sum(m.in_use_bytes for m in system.memory.values()) == before
        s.run(lambda: v.value)
        assert sum(m.in_use_bytes for m in system.memory.values()) == before + 8000
        assert "MirroredVariable 'big'" in repr(v)
    cfg = ipu_node.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.ipus_per_replica = 1                 # a bound layout: placed at creation
    system = cfg.configure_ipu_system()
    with IPUStrategy().scope() as s:
        kept = s.Variable(np.ones(1000, np.float32), name="big")
        assert sum(m.in_use_bytes for m in system.memory.values()) == 8000
        assert kept.ipu_id == system.devices[0].ipus[0].id
