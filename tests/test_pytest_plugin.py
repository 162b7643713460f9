"""ipupod's pytest plugin (@pytest.mark.poprun) and poprun.testing.run_job, tested with
pytest's own pytester: each test writes a test file, runs pytest on it in a child process
(hard timeout), and reads the outcome; every job's processes, working directories, lock
files and shared memory must be gone afterwards."""

import os
import shutil
import tempfile

import numpy as np
import pytest

from poprun import _job_files
from poprun.testing import InstanceOutcome, JobResult, run_job
from tests.procs import (PYTHON, ROOT, child_env, describe, left_in_shm, run, shm_entries,
                         wait_no_processes)

pytest_plugins = ["pytester"]

#: seconds a pytester run may take (its jobs have their own, shorter timeouts)
RUN_S = 120
_INSTANCE = "poprun._job_instance"


@pytest.fixture
def session(pytester, monkeypatch):
    """pytester with the repository importable, the plugin named (``-p``: a checkout need
    not be installed), a fresh lock directory and TMPDIR; checks that nothing is left
    (MPICH's shared memory: only where the test says its jobs used MPI, ``run.mpi = True``;
    other jobs on this machine make and remove segments too)."""
    tmp = tempfile.mkdtemp(prefix="ipt-")   # short: socket paths live under it
    occupancy = os.path.join(tmp, "occupancy")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(pytester.path),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("IPUPOD_OCCUPANCY_DIR", occupancy)
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setenv("IPUPOD_COLLECTIVE_TIMEOUT_S", "60")
    segments = shm_entries()

    def run(*args):
        return pytester.runpytest_subprocess("-p", "poprun.pytest_plugin", *args,
                                             timeout=RUN_S)

    run.mpi = False
    yield run
    runtime = os.path.join(tmp, f"poprun-{os.getuid()}")
    left = os.listdir(runtime) if os.path.isdir(runtime) else []
    locks = [os.path.join(d, f) for d, _, files in os.walk(occupancy) for f in files
             if f.endswith(".lock")]
    shutil.rmtree(tmp, ignore_errors=True)
    assert wait_no_processes(_INSTANCE, 10) == [], "instances were left behind"
    assert left == [], "job directories were left behind"
    assert locks == [], "lock files were left behind"
    if run.mpi:
        assert left_in_shm(segments) == set(), "shared memory was left behind"


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["mpi", "grpc"])
def test_a_marked_test_runs_in_every_instance_with_its_fixtures(session, pytester, transport):
    session.mpi = transport == "mpi"
    evidence = pytester.path / "evidence"
    evidence.mkdir()
    pytester.makeconftest(f"""
        import os, pytest

        @pytest.fixture
        def instance_pid():
            return os.getpid()
    """)
    pytester.makepyfile(test_job=f"""
        import json, os
        import pytest
        from poprun import popdist

        @pytest.mark.poprun(num_instances=2, num_replicas=4, transport="{transport}")
        def test_job(instance_pid, tmp_path):
            i = popdist.getInstanceIndex()
            (tmp_path / "mine").write_text(str(i))
            with open(os.path.join({str(evidence)!r}, str(i)), "w") as f:
                json.dump({{"pid": instance_pid, "offset": popdist.getReplicaIndexOffset(),
                           "local": popdist.getNumLocalReplicas(), "tmp": str(tmp_path),
                           "transport": os.environ["IPUPOD_TRANSPORT"]}}, f)
            print("instance", i, "says hello")

        def test_plain():
            assert "IPUPOD_INSTANCE_INDEX" not in os.environ
    """)
    result = session("-rP")
    result.assert_outcomes(passed=2)
    import json
    seen = [json.loads((evidence / str(i)).read_text()) for i in range(2)]
    assert [s["offset"] for s in seen] == [0, 2]
    assert [s["local"] for s in seen] == [2, 2]
    assert {s["transport"] for s in seen} == {transport}
    assert len({s["pid"] for s in seen}) == 2          # the fixture ran in each instance
    assert seen[0]["tmp"] != seen[1]["tmp"]            # and tmp_path is each one's own
    result.stdout.fnmatch_lines(["*instance 0 stdout*", "instance 0 says hello",
                                 "*instance 1 stdout*", "instance 1 says hello"])


@pytest.mark.slow
def test_an_instance_that_raises_is_named_with_its_traceback(session, pytester):
    pytester.makepyfile(test_fail="""
        import pytest
        from poprun import popdist

        def check(i):
            if i == 1:
                raise ValueError(f"instance {i} disagrees")

        @pytest.mark.poprun(num_instances=3, transport="grpc")
        def test_job():
            print("before the check")
            check(popdist.getInstanceIndex())
    """)
    result = session()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "job (3 instances, 3 replicas, transport grpc) failed: instance 1\n" in text, text
    assert "instance 1: failed: ValueError: instance 1 disagrees" in text
    assert "--- instance 1: traceback ---" in text
    assert 'raise ValueError(f"instance {i} disagrees")' in text   # the instance's traceback
    result.stdout.fnmatch_lines(["*Captured instance 1 stdout call*", "before the check"])
    for i in (0, 2):   # the others: finished, or stopped before they finished
        assert (f"instance {i}: finished" in text
                or f"instance {i}: stopped before it finished" in text), text


@pytest.mark.slow
def test_an_instance_that_dies_without_a_word_is_named_by_its_exit_code(session, pytester):
    # (grpc: poprun's own launcher sees every exit code at once; under mpirun, an instance
    # that os._exits before MPI_Init is not noticed by Hydra, and the job's timeout ends it)
    pytester.makepyfile(test_exit="""
        import os
        import pytest
        from poprun import popdist

        @pytest.mark.poprun(num_instances=2, transport="grpc")
        def test_job():
            if popdist.getInstanceIndex() == 1:
                os._exit(3)
    """)
    result = session()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "failed: instance 1\n" in text, text
    assert "instance 1: failed: exit code 3" in text


@pytest.mark.slow
def test_an_instance_that_hangs_is_stopped_at_the_timeout_and_named(session, pytester):
    session.mpi = True
    pytester.makeini("[pytest]\npoprun_timeout = 4\n")   # the default of every job
    pytester.makepyfile(test_hang="""
        import time
        import pytest
        from poprun import popdist

        def wait_for_ever():
            while True:
                time.sleep(0.1)

        @pytest.mark.poprun(num_instances=2, transport="mpi")
        def test_job():
            if popdist.getInstanceIndex() == 1:
                wait_for_ever()
    """)
    result = session()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "timed out after 4 s: instance 1 had not finished" in text, text
    assert "instance 0: finished" in text
    assert "the stacks of its threads:" in text
    assert "in wait_for_ever" in text             # faulthandler's dump of the hung instance


@pytest.mark.slow
def test_a_failure_in_a_replica_function_names_the_replica(session, pytester):
    session.mpi = True
    pytester.makepyfile(test_replica="""
        import numpy as np
        import pytest
        import ipu_node
        from poprun import popdist
        from collectives import cross_replica_sum, replication_index
        from collectives.strategies import IPUMultiReplicaStrategy

        @pytest.fixture
        def strategy():
            cfg = ipu_node.IPUConfig()
            popdist.set_ipu_config(cfg, ipus_per_replica=1)
            cfg.configure_ipu_system()
            yield IPUMultiReplicaStrategy()
            ipu_node.reset_ipu_configuration()

        def step(x):
            if int(replication_index()) == 2:
                raise FloatingPointError("replica 2 diverged")
            return cross_replica_sum(x)

        @pytest.mark.poprun(num_instances=2, num_replicas=4, transport="mpi")
        def test_job(strategy):
            with strategy.scope():
                strategy.run(step, args=(np.ones(3),))
    """)
    result = session()
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "failed: instance 1 (replica 2)\n" in text, text
    assert "instance 1: failed in replica 2: FloatingPointError: replica 2 diverged" in text


@pytest.mark.slow
def test_x_lf_and_k_with_marked_and_unmarked_tests_in_one_file(session, pytester):
    pytester.makepyfile(test_mixed="""
        import pytest
        from poprun import popdist

        def test_unmarked_first():
            pass

        @pytest.mark.poprun(num_instances=2)
        def test_marked_fails():
            assert popdist.getInstanceIndex() == 0

        @pytest.mark.poprun(num_instances=2)
        def test_marked_passes():
            assert popdist.getNumInstances() == 2

        def test_unmarked_last():
            pass
    """)
    first = session("-x")
    first.assert_outcomes(passed=1, failed=1)          # -x: nothing after the failure ran
    again = session("--lf")
    again.assert_outcomes(failed=1)                    # --lf: only the failed marked test
    again.stdout.fnmatch_lines(["*rerun previous 1 failure*"])
    picked = session("-k", "passes or last")
    picked.assert_outcomes(passed=2, deselected=2)


# -- no processes: the parts ------------------------------------------------------------

def test_a_bad_marker_fails_the_test_naming_it(pytester):
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.poprun(num_instances=2, num_replica=4)
        def test_typo():
            pass

        @pytest.mark.poprun(num_instances=3, num_replicas=4)
        def test_indivisible():
            pass
    """)
    result = pytester.runpytest("-p", "poprun.pytest_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*test_bad.py::test_typo: @pytest.mark.poprun has no keyword num_replica; known: "
        "num_instances, num_replicas,*",
        "*--num-replicas (4) must be divisible by --num-instances (3)*"])


def test_the_marker_s_timeout_wins_over_the_ini_option():
    from types import SimpleNamespace
    from poprun.pytest_plugin import _marker_options
    item = SimpleNamespace(nodeid="t.py::t", config=SimpleNamespace(getini=lambda name: "4"))
    assert _marker_options(item, pytest.mark.poprun(3).mark) == {"num_instances": 3,
                                                                 "timeout": 4.0}
    assert _marker_options(item, pytest.mark.poprun(timeout=9).mark) == {"timeout": 9}
    with pytest.raises(ValueError, match="takes num_instances by position and the rest by "
                                         "keyword"):
        _marker_options(item, pytest.mark.poprun(2, 4).mark)
    item.config.getini = lambda name: "soon"
    with pytest.raises(ValueError, match="poprun_timeout = 'soon' is not a number of seconds"):
        _marker_options(item, pytest.mark.poprun().mark)


def test_instances_load_the_parent_s_plugins_by_name():
    import json
    from types import SimpleNamespace
    from poprun import pytest_plugin

    def config(*plugins):
        return SimpleNamespace(
            pluginmanager=SimpleNamespace(list_plugin_distinfo=lambda: [(p, None)
                                                                        for p in plugins]),
            invocation_params=SimpleNamespace(args=("-p", "xdist", "-pfoo", "-k", "x")))

    # installed plugins (this one aside) and the command line's -p, no entry point scan
    assert pytest_plugin._plugin_args(config(json, pytest_plugin)) == (
        ["-p", "json", "-p", "xdist", "-p", "foo"], False)
    # a plugin object that is not a module cannot be named: the instances scan themselves
    assert pytest_plugin._plugin_args(config(json, object()))[1] is True


def _module_level(x):
    return x


def test_run_job_refuses_what_an_instance_cannot_find_or_read():
    with pytest.raises(TypeError, match="top level of a module"):
        run_job(lambda: 1)
    with pytest.raises(TypeError, match=r"args\[0\]: a set cannot cross"):
        run_job(_module_level, {1, 2})
    with pytest.raises(ValueError, match="num_instances must be a positive integer, got 0"):
        run_job(_module_level, 1, num_instances=0)
    with pytest.raises(ValueError, match="transport must be 'mpi' or 'grpc'"):
        run_job(_module_level, 1, transport="tcp")


def test_values_cross_as_json_and_npy_never_pickled(tmp_path):
    value = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": (1, "x", None),
             "c": [np.int64(7), 2.5, True], "d": np.float16(0.5)}
    data = _job_files.encode_value(value, str(tmp_path), "v")
    back = _job_files.decode_value(data, str(tmp_path))
    np.testing.assert_array_equal(back["a"], value["a"])
    assert back["a"].dtype == np.float32
    assert back["b"] == (1, "x", None)
    assert back["c"][0] == 7 and back["c"][0].dtype == np.int64 and back["c"][1:] == [2.5, True]
    assert back["d"].dtype == np.float16
    with pytest.raises(_job_files.ValueFormatError, match=r"value\['o'\]: a numpy array of "
                                                          "Python objects"):
        _job_files.encode_value({"o": np.array([object()])}, str(tmp_path), "w")
    with pytest.raises(_job_files.ValueFormatError, match="dict keys must be strings"):
        _job_files.encode_value({1: 2}, str(tmp_path), "w")


def test_a_report_names_the_cause_not_the_instances_that_lost_it():
    result = JobResult(
        outcomes=(InstanceOutcome(0, "failed", "PeerLostError: instance 1 gave up", "tb0", 1),
                  InstanceOutcome(1, "failed", "ValueError: boom", "Traceback: boom", 3,
                                  stdout="a\nb"),
                  InstanceOutcome(2, "passed")),
        timed_out=False, timeout_s=60, launcher_error="instance 1 failed (exit code 1)",
        launcher_output="", shape="3 instances, 6 replicas, transport mpi")
    assert result.failed == [1]
    report = result.report()
    assert report.splitlines()[:4] == [
        "job (3 instances, 6 replicas, transport mpi) failed: instance 1 (replica 3)",
        "  instance 0: failed in replica 1: PeerLostError: instance 1 gave up",
        "  instance 1: failed in replica 3: ValueError: boom",
        "  instance 2: finished"]
    assert "--- instance 1: traceback ---\nTraceback: boom" in report
    assert "tb0" not in report                 # a consequence's traceback is not repeated
    assert "--- instance 1: stdout ---\na\nb" in report


@pytest.mark.slow
def test_the_readme_s_example_test_file_passes():
    # examples/test_distributed_code.py, as a user runs it (README: "Testing your
    # distributed code"): sharding, a collective under PopDistStrategy, a PopTorch model
    example = ROOT / "examples" / "test_distributed_code.py"
    segments = shm_entries()
    result = run([PYTHON, "-m", "pytest", "-p", "poprun.pytest_plugin", "-p",
                  "no:cacheprovider", "-q", str(example)], timeout_s=300, env=child_env(),
                 cwd=ROOT)
    assert result.returncode == 0, describe(result)
    assert "4 passed" in result.stdout, describe(result)
    assert wait_no_processes(_INSTANCE, 10) == []
    assert left_in_shm(segments) == set()


@pytest.mark.slow
def test_the_plugin_imports_nothing_heavy():
    # it is loaded in every pytest run of an environment where ipupod is installed
    code = ("import sys, poprun.pytest_plugin, poprun.testing; print(sorted(m for m in "
            "('mpi4py', 'grpc', 'torch', 'tensorflow', 'numpy', 'ipu_node', 'collectives') "
            "if m in sys.modules))")
    result = run([PYTHON, "-c", code], timeout_s=60, env=child_env(), cwd=ROOT)
    assert result.returncode == 0, describe(result)
    assert result.stdout.strip() == "[]", describe(result)
