"""poprun end to end: real instances started through mpirun."""

import json
import re
import time

import numpy as np
import pytest

from poprun.cli import main as poprun_main
from tests.procs import (PROGRAMS, describe, left_in_shm, run_poprun, shm_entries,
                         wait_no_processes)


@pytest.mark.slow
def test_every_instance_gets_its_environment(tmp_path):
    result = run_poprun(["--num-instances", "2", "--num-replicas", "4", "--ipus-per-replica",
                         "2", "python", str(PROGRAMS / "dump_env.py"), str(tmp_path)], 60)
    assert result.returncode == 0, describe(result)
    seen = [json.loads((tmp_path / f"instance_{i}.json").read_text()) for i in range(2)]
    job_ids = {s["env"]["IPUPOD_JOB_ID"] for s in seen}
    assert len(job_ids) == 1 and job_ids != {""}
    for i, s in enumerate(seen):
        env = s["env"]
        assert env["POPDIST_NUM_TOTAL_REPLICAS"] == "4"
        assert env["POPDIST_NUM_IPUS_PER_REPLICA"] == "2"
        assert env["POPDIST_NUM_LOCAL_REPLICAS"] == "2"
        assert env["POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"] == "1"
        assert env["POPDIST_REPLICA_INDEX_OFFSET"] == str(2 * i)
        assert env["POPDIST_LOCAL_INSTANCE_INDEX"] == str(i)
        assert env["IPUPOD_INSTANCE_INDEX"] == str(i)
        assert env["IPUPOD_NUM_INSTANCES"] == "2"
        assert s["popdist"] == {
            "isPopdistEnvSet": True, "getNumInstances": 2, "getInstanceIndex": i,
            "getNumTotalReplicas": 4, "getNumLocalReplicas": 2, "getReplicaIndexOffset": 2 * i,
            "getNumIpusPerReplica": 2, "getLocalInstanceIndex": i}


@pytest.mark.slow
def test_output_is_tagged_per_instance_and_stream():
    code = "import sys; print('out'); print('err', file=sys.stderr); print('end', end='')"
    result = run_poprun(["-n", "3", "python", "-c", code], 60)
    assert result.returncode == 0, describe(result)
    for i in range(3):
        assert f"[1,{i}]<stdout>:out\n" in result.stdout
        assert f"[1,{i}]<stdout>:end\n" in result.stdout
        assert f"[1,{i}]<stderr>:err\n" in result.stderr
    assert all(line.startswith("[1,") for line in result.stdout.splitlines())


@pytest.mark.slow
def test_a_failing_exit_code_is_passed_on():
    result = run_poprun(["-n", "2", "python", "-c", "import sys; sys.exit(3)"], 60)
    assert result.returncode == 3, describe(result)
    assert "exit code 3" in result.stderr


@pytest.mark.slow
def test_an_instance_that_raises_stops_the_job_and_is_named():
    segments = shm_entries()
    started = time.monotonic()
    result = run_poprun(["-n", "3", "python", str(PROGRAMS / "fail_in_collective.py"), "1"], 30)
    elapsed = time.monotonic() - started
    assert result.returncode != 0, describe(result)
    assert elapsed < 30
    assert "poprun: instance 1 failed" in result.stderr, describe(result)
    assert "RuntimeError: deliberate failure of this instance" in result.stderr
    assert "[1,1]<stderr>:RuntimeError: deliberate failure" in result.stderr
    assert "unreachable" not in result.stdout
    assert wait_no_processes("fail_in_collective.py") == []
    assert left_in_shm(segments) == set()  # MPICH's shared memory is not left behind


@pytest.mark.parametrize("argv, message", [
    (["--num-instances", "3", "--num-replicas", "4"],
     "poprun: error: --num-replicas (4) must be divisible by --num-instances (3)"),
    (["-n", "0"], "poprun: error: argument -n/--num-instances: must be a positive integer"),
    (["-n", "-2"], "poprun: error: argument -n/--num-instances: must be a positive integer"),
    (["--num-replicas", "0"], "poprun: error: argument --num-replicas: must be a positive"),
    (["--ipus-per-replica", "0"], "poprun: error: argument --ipus-per-replica: must be"),
])
def test_bad_arguments_exit_2_with_one_line_and_start_nothing(argv, message, tmp_path, capsys):
    marker = tmp_path / "started"
    code = poprun_main([*argv, "python", "-c", f"open({str(marker)!r}, 'w')"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(message), err
    assert err.count("\n") == 1
    assert not marker.exists()


def test_a_missing_program_exits_2_with_one_line(capsys):
    assert poprun_main(["-n", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("poprun: error:") and "program" in err and err.count("\n") == 1


@pytest.mark.slow
def test_bad_arguments_from_the_command_line_too():
    result = run_poprun(["--num-instances", "3", "--num-replicas", "4", "python", "-V"], 30)
    assert result.returncode == 2
    assert result.stderr.strip() == \
        "poprun: error: --num-replicas (4) must be divisible by --num-instances (3)"
    assert result.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("instances", [1, 2, 4])
def test_cross_replica_sum_is_bit_identical_for_every_layout(tmp_path, instances):
    """1x4, 2x2 and 4x1 (instances x local replicas) give the same bytes as the tree oracle."""
    out = tmp_path / "sum.npy"
    result = run_poprun(["-n", str(instances), "--num-replicas", "4", "python",
                         str(PROGRAMS / "layout_sum.py"), str(out)], 90)
    assert result.returncode == 0, describe(result)
    data = np.random.default_rng(1234).standard_normal((4, 4099)).astype(np.float32) * 1e3
    full = (data[0] + data[1]) + (data[2] + data[3])
    pair = data[0] + data[1]
    expected = np.concatenate([full, pair, full[:5]])
    assert np.load(out).tobytes() == expected.tobytes()


@pytest.mark.slow
def test_system_and_topology_reach_the_instances(tmp_path):
    result = run_poprun(["--system", "C2-16", "-n", "2", "--num-replicas", "4",
                         "--print-topology", "python", str(PROGRAMS / "dump_env.py"),
                         str(tmp_path)], 60)
    assert result.returncode == 0, describe(result)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| hosts     | localhost")
    assert lines[2].startswith("| instances | 0")
    assert lines[4].replace(" ", "") == "|IPUs|5|7|4|6|"  # the C2-16 device 24's IPUs, AUTO order
    for i in range(2):
        env = json.loads((tmp_path / f"instance_{i}.json").read_text())["env"]
        assert env["IPUPOD_SYSTEM"] == "C2-16"


@pytest.mark.parametrize("argv, message", [
    (["--system", "POD99"], "poprun: error: unknown IPU-POD system 'POD99'"),
    (["--system", "POD16", "-n", "4", "--num-replicas", "16", "--ipus-per-replica", "2"],
     "poprun: error: the job needs 4 instances x 4 replicas x 2 IPUs per replica = 32 IPUs, "
     "but POD16 has 16 IPUs"),
    # no system named: none of the emulated ones holds 512 IPUs, and the largest says so
    (["-n", "4", "--num-replicas", "256", "--ipus-per-replica", "2"],
     "poprun: error: the job needs 4 instances x 64 replicas x 2 IPUs per replica = 512 IPUs, "
     "but POD256 has 256 IPUs"),
])
def test_a_job_that_does_not_fit_the_system_starts_nothing(argv, message, tmp_path, capsys,
                                                           monkeypatch):
    monkeypatch.delenv("IPUPOD_SYSTEM", raising=False)
    marker = tmp_path / "started"
    assert poprun_main([*argv, "python", "-c", f"open({str(marker)!r}, 'w')"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not marker.exists()


def test_launcher_and_ipu_node_agree_on_the_environment_names():
    import ipu_node.env
    from launch import env
    assert env.SYSTEM == ipu_node.env.IPUPOD_SYSTEM
    assert env.JOB_ID == ipu_node.env.IPUPOD_JOB_ID
    assert env.PARTITION_IPUS == ipu_node.env.IPUPOD_PARTITION_IPUS


@pytest.mark.slow
def test_a_program_started_by_plain_mpirun_is_one_replica_per_rank(tmp_path):
    """No poprun: popdist takes rank and size from MPICH's PMI_* variables."""
    import os
    import signal
    import subprocess
    import sys

    from launch.mpirun import find_mpirun
    out = tmp_path / "sum.npy"
    proc = subprocess.Popen([find_mpirun(), "-n", "2", sys.executable,
                             str(PROGRAMS / "layout_sum.py"), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, output
    data = np.random.default_rng(1234).standard_normal((2, 4099)).astype(np.float32) * 1e3
    full = data[0] + data[1]
    assert np.load(out).tobytes() == np.concatenate([full, full, full[:5]]).tobytes()


@pytest.mark.slow
def test_the_readme_minimal_program_prints_what_the_readme_says(tmp_path):
    import re

    from tests.procs import ROOT
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## A minimal program\n\n```python\n(.*?)```", readme, re.S).group(1)
    program = tmp_path / "minimal.py"
    program.write_text(code)
    result = run_poprun(["-n", "2", "--num-replicas", "4", "python", str(program)], 60)
    assert result.returncode == 0, describe(result)
    expected = "[array([6., 6., 6.], dtype=float32), array([6., 6., 6.], dtype=float32)]"
    # the instances print at the same time: each prints its line once, in either order (the
    # README says so); the order in poprun's output is the order they reached print()
    assert sorted(result.stdout.splitlines()) == [f"[1,0]<stdout>:{expected}",
                                                  f"[1,1]<stdout>:{expected}"], describe(result)


@pytest.mark.slow
def test_an_instance_killed_by_sigkill_under_mpirun_is_reported():
    """mpirun stops the others with signals too, so which went first cannot be known: poprun
    names the killed instance among those that died, never a wrong one alone."""
    segments = shm_entries()
    started = time.monotonic()
    result = run_poprun(["-n", "3", "python", str(PROGRAMS / "kill_self.py"), "1"], 30)
    assert time.monotonic() - started < 15
    assert result.returncode == 128 + 9, describe(result)
    last = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"poprun: (instance 1 failed \(killed by SIGKILL\)|instances [0-9, ]*"
                        r"\b1\b[0-9, ]* were killed by SIGKILL; .* which failed first is "
                        r"unknown); the other instances were stopped", last), describe(result)
    assert "unreachable" not in result.stdout
    assert wait_no_processes("kill_self.py") == []
    assert left_in_shm(segments) == set()
