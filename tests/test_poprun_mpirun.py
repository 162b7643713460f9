"""What poprun hands mpirun and what the instances of a job get: the Open MPI flags of
--mpi-*-args translated for Hydra, the interface checked, the exact mpirun command line
(without the job token), real jobs with Graphcore's options, and popdist's names."""

import os
import sys

import pytest

from launch.hydra import mpirun_command_line, mpirun_environment
from launch.plan import make_plan
from poprun.mpi_args import MpiArgsError, translate_mpi_args
from tests.procs import describe, run_poprun

def test_open_mpi_flags_translation_table():
    t = translate_mpi_args("--tag-output -x A=1 -x B --bind-to=core:overload-allowed "
                           "--mca plm_rsh_agent /usr/bin/ssh -iface eth1")
    assert t.mpirun_args == ("-bind-to", "core", "-launcher-exec", "/usr/bin/ssh",
                             "-iface", "eth1")
    assert t.env == (("A", "1"),)
    assert len(t.notes) == 3
    with pytest.raises(MpiArgsError, match="unexpected word 'stray'"):
        translate_mpi_args("--tag-output stray")


def test_an_interface_is_checked_against_this_machines():
    from poprun.mpi_args import check_interface
    mine = ["lo", "eth0"]
    assert check_interface(("-iface", "eth0", "-bind-to", "core"), remote_hosts=("h2",),
                           interfaces=mine) == (("-iface", "eth0", "-bind-to", "core"), [])
    args, notes = check_interface(("-bind-to", "core", "-iface", "eno1"), remote_hosts=(),
                                  interfaces=mine)
    assert args == ("-bind-to", "core") and len(notes) == 1 and "'eno1'" in notes[0]
    with pytest.raises(MpiArgsError, match=r"no interface 'eno1' \(its interfaces: lo, "
                                           r"eth0\), and mpirun here uses it to reach h2"):
        check_interface(("-iface", "eno1"), remote_hosts=("h2",), interfaces=mine)
    assert check_interface(("-iface", "eno1"), remote_hosts=("h2",), interfaces=[]) == (
        ("-iface", "eno1"), [])  # nothing known to check against: Hydra decides


# -- the mpirun command line -------------------------------------------------------------

TOKEN = "d3adb33fd3adb33fd3adb33fd3adb33f"


def test_the_exact_mpirun_command_line_of_a_two_instance_grpc_job():
    plan = make_plan(["python", "train.py"], 2, 4, transport="grpc", job_id="j1",
                     job_token=TOKEN, system="POD16", coordinator_address="127.0.0.1:5000")
    cmd = mpirun_command_line(plan, "/m/mpirun", "/w", ["prog", "arg"])
    block = lambda i, off: ["-n", "1", "-env", "POPDIST_NUM_LOCAL_REPLICAS", "2",  # noqa: E731
                            "-env", "POPDIST_REPLICA_INDEX_OFFSET", str(off),
                            "-env", "POPDIST_LOCAL_INSTANCE_INDEX", str(i),
                            "-env", "IPUPOD_INSTANCE_INDEX", str(i),
                            "-env", "IPUPOD_ERROR_FILE", f"/w/error.{i}.json", "prog", "arg"]
    assert cmd == ["/m/mpirun", "-print-all-exitcodes", "-outfile-pattern", "/w/out.%r",
                   "-errfile-pattern", "/w/err.%r", "-genv", "PYTHONUNBUFFERED", "1",
                   *block(0, 0), ":", *block(1, 2)]
    assert not any(TOKEN in word for word in cmd)
    env = mpirun_environment(plan, {"PATH": "/bin"})
    assert env["IPUPOD_JOB_TOKEN"] == TOKEN
    assert env["IPUPOD_COORDINATOR_ADDRESS"] == "127.0.0.1:5000"
    assert env["POPDIST_NUM_TOTAL_REPLICAS"] == "4" and env["PATH"] == "/bin"


def test_the_exact_mpirun_command_line_across_two_hosts():
    plan = make_plan(["python", "t.py"], 4, 4, job_id="j2", hosts=("ha", "hb"),
                     remote_hosts=("ha", "hb"), mpirun_args=("-iface", "eth1"),
                     instance_env_extra=((3, (("ROLE", "last"),)),))
    cmd = mpirun_command_line(plan, "mpirun", "/w", ["p"])
    assert cmd[:12] == ["mpirun", "-print-all-exitcodes", "-outfile-pattern", "/w/out.%r",
                        "-errfile-pattern", "/w/err.%r", "-genv", "PYTHONUNBUFFERED", "1",
                        "-hosts", "ha:2,hb:2"] + ["-iface"][:1]
    assert cmd[12] == "eth1"
    blocks = " ".join(cmd[13:]).split(" : ")
    assert len(blocks) == 4
    assert ["POPDIST_LOCAL_INSTANCE_INDEX " + str(i % 2) in b for i, b in enumerate(blocks)] == \
        [True] * 4
    assert blocks[3].startswith("-n 1 -env ROLE last -env POPDIST_NUM_LOCAL_REPLICAS 1")


def test_a_local_host_job_has_no_hosts_option():
    plan = make_plan(["p"], 2, hosts=("localhost", "127.0.0.1"))
    assert "-hosts" not in mpirun_command_line(plan, "mpirun", "/w", ["p"])


# -- real jobs ---------------------------------------------------------------------------

TOKEN_CHECK = r"""
import os, sys
token = os.environ["IPUPOD_JOB_TOKEN"]
open(os.path.join(sys.argv[1], "token"), "w").write(token)
seen = []
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and token.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            seen.append(pid)
    except OSError:
        pass
print("token on a command line:", seen)
"""


@pytest.mark.slow
def test_the_token_is_on_no_command_line_and_in_no_log_of_an_mpirun_grpc_job(tmp_path):
    result = run_poprun(["-vv", "--launcher", "mpirun", "--transport", "grpc", "-n", "2",
                         "python", "-c", TOKEN_CHECK, str(tmp_path)], 60)
    assert result.returncode == 0, describe(result)
    token = (tmp_path / "token").read_text()
    assert len(token) == 32
    assert result.stdout.count("token on a command line: []") == 2, describe(result)
    assert token not in result.stdout + result.stderr
    assert "POPRUN [I] Running command:" in result.stderr  # -vv did log the command line


@pytest.mark.slow
def test_options_reach_the_instances(tmp_path):
    """A real job with Graphcore's options: the instances' environment, the cache directory,
    the named partition and the output of one instance only."""
    cache = tmp_path / "cache dir"
    code = ("import os, sys; from poprun import popdist; i = popdist.getInstanceIndex(); "
            "keys = ('POPDIST_EXECUTABLE_CACHE_PATH', 'IPUOF_VIPU_API_PARTITION_ID', 'STAGE', "
            "'ONLY0', 'POPDIST_LOCAL_INSTANCE_INDEX', 'IPUPOD_JOB_ID'); "
            "print(i, [os.environ.get(k) for k in keys])")
    result = run_poprun(["--num-instances=2", "--vipu-partition", "cli-test-part",
                         f"--executable-cache-path={cache}", "--only-output-from-instance=1",
                         "--mpi-local-args=-x STAGE=fit --tag-output",
                         "--instance-mpi-local-args=0:\"-x ONLY0=yes\"", "-v",
                         "python", "-c", code], 60,
                        env={"IPUPOD_OCCUPANCY_DIR": str(tmp_path / "occ")})
    assert result.returncode == 0, describe(result)
    assert cache.is_dir()
    assert result.stdout.strip() == (
        f"[1,1]<stdout>:1 ['{cache}', 'cli-test-part', 'fit', None, '1', 'cli-test-part']")
    assert "POPRUN [I] --mpi-local-args --tag-output: no effect" in result.stderr
    assert "created partition cli-test-part" in result.stderr
    assert "removed partition cli-test-part" in result.stderr


@pytest.mark.slow
def test_a_named_partition_of_another_size_needs_update_partition(tmp_path):
    env = {"IPUPOD_OCCUPANCY_DIR": str(tmp_path / "occ")}
    first = run_poprun(["--vipu-partition=keep-me", "--remove-partition=no", "-n", "2",
                        "python", "-V"], 60, env=env)
    assert first.returncode == 0, describe(first)
    second = run_poprun(["--vipu-partition=keep-me", "-n", "4", "python", "-V"], 60, env=env)
    assert second.returncode == 2
    assert "partition keep-me has 2 IPUs, the job needs 4; add --update-partition yes" in \
        second.stderr
    third = run_poprun(["--vipu-partition=keep-me", "--update-partition", "-n", "4", "-v",
                        "python", "-V"], 60, env=env)
    assert third.returncode == 0, describe(third)
    assert "updated partition keep-me: 2 -> 4 IPUs" in third.stderr
    assert not (tmp_path / "occ" / "POD16" / "job-keep-me").exists()  # removed by default


@pytest.mark.slow
def test_log_lines_look_like_graphcores(tmp_path):
    result = run_poprun(["-v", "python", "-V"], 60)
    assert result.returncode == 0, describe(result)
    import re
    line = result.stderr.splitlines()[0]
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d\d\d \d+ POPRUN \[I\] .+", line), line


@pytest.mark.slow
def test_popdist_package_gives_graphcores_names(tmp_path):
    code = ("import popdist, popdist.tensorflow; from ipu_node import IPUConfig; "
            "popdist.init(); c = IPUConfig(); "
            "popdist.tensorflow.set_ipu_config(c, 1, configure_device=True); "
            "print(popdist.getInstanceIndex(), popdist.getNumInstances(), "
            "popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(), "
            "popdist.getReplicaIndexOffset(), popdist.getNumIpusPerReplica(), "
            "popdist.getDeviceId(), popdist.isPopdistEnvSet(), c.auto_select_ipus, "
            "c.experimental.multi_replica_distribution.process_index, "
            "popdist.execute_on_instances([1], lambda: 'ran'))")
    result = run_poprun(["-n", "2", "--num-replicas", "4", "python", "-c", code], 60)
    assert result.returncode == 0, describe(result)
    lines = sorted(result.stdout.splitlines())
    # POD16: instance 0 has IPUs 0,1 (the gc-info device 16), instance 1 IPUs 2,3 (17)
    assert lines == ["[1,0]<stdout>:0 2 4 2 0 1 16 True 2 0 None",
                     "[1,1]<stdout>:1 2 4 2 2 1 17 True 2 1 ran"], describe(result)


def test_popdist_alone_and_its_errors(monkeypatch):
    import popdist
    import popdist.tensorflow
    from ipu_node import IPUConfig
    for name in list(os.environ):
        if name.startswith(("POPDIST_", "IPUPOD_", "OMPI_", "PMI_")) or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    popdist.init()
    assert (popdist.isPopdistEnvSet(), popdist.getNumInstances(), popdist.getInstanceIndex()) \
        == (False, 1, 0)
    cfg = IPUConfig()
    popdist.tensorflow.set_ipu_config(cfg, 2, configure_device=False)
    assert cfg.ipus_per_replica == 2 and cfg.auto_select_ipus == []
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "4")
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", "2")
    monkeypatch.setenv("POPDIST_REPLICA_INDEX_OFFSET", "3")
    with pytest.raises(ValueError, match="POPDIST_REPLICA_INDEX_OFFSET=3"):
        popdist.init()
    assert sys.modules["popdist"].__all__
