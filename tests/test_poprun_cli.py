"""poprun's command line as people call it: every option of Graphcore's poprun, both value
forms, usage errors before anything starts, and the system a job runs on (the Open MPI flags,
the mpirun command line and real jobs: test_poprun_mpirun.py)."""

import json
import os

import pytest

from poprun.cli import main as poprun_main
from poprun.cli import plan_from_args
from poprun.hosts import expand_hosts, is_this_machine
from poprun.options import build_parser, parse_args

PROGRAM = ["python", "train.py", "--epochs", "3"]


def plan_of(argv):
    """(args, plan, notes) of ``poprun argv train.py`` without starting anything."""
    args, program = parse_args(build_parser(), [*argv, *PROGRAM])
    assert program == PROGRAM, program
    plan, notes = plan_from_args(args, program, find=lambda: "/opt/mpich/bin/mpirun")
    return args, plan, notes


def env_of(plan):
    return dict(plan.job_env)


# Command lines of the kind IPU projects' launch scripts use (written for this test), and
# what each must become. Every option of Graphcore's poprun appears at least once, in the
# "--opt=value" form and in the "--opt value" form.
CASES = [
    # counts, both forms, and ipupod's -n
    (["--num-instances=4", "--num-replicas=8", "--ipus-per-replica=2"],
     lambda a, p, n: (p.num_instances, p.num_replicas, p.ipus_per_replica) == (4, 8, 2)),
    (["--num-instances", "4", "--num-replicas", "8", "--ipus-per-replica", "2"],
     lambda a, p, n: [i.replica_index_offset for i in p.instances] == [0, 2, 4, 6]),
    (["-n", "2"], lambda a, p, n: p.num_instances == 2 and p.num_replicas == 2),
    (["-n2"], lambda a, p, n: p.num_instances == 2),
    # verbosity
    (["-vv"], lambda a, p, n: a.verbose == 2),
    (["--vv"], lambda a, p, n: a.verbose == 2),
    (["-v", "-v"], lambda a, p, n: a.verbose == 2),
    (["--verbose"], lambda a, p, n: a.verbose == 1),
    (["--debug"], lambda a, p, n: a.debug is True),
    # hosts: evenly and in order, local instance index per host
    (["--host=pod-host-a,pod-host-b", "--num-instances=4", "--num-replicas=8"],
     lambda a, p, n: ([i.host for i in p.instances] == ["pod-host-a"] * 2 + ["pod-host-b"] * 2
                      and [i.local_instance_index for i in p.instances] == [0, 1, 0, 1]
                      and p.launcher == "mpirun"
                      and p.remote_hosts == ("pod-host-a", "pod-host-b"))),
    (["-H", "pod-host[1-2]", "-n", "2"],
     lambda a, p, n: p.hosts == ("pod-host1", "pod-host2")),
    (["--host", "localhost,127.0.0.1", "-n", "2"],
     lambda a, p, n: p.remote_hosts == () and p.hosts == ("localhost", "127.0.0.1")),
    (["--host-subnet=10.5.0.0/16"], lambda a, p, n: any("--host-subnet" in x for x in n)),
    (["--host-subnet", "10.5.0.0/16"], lambda a, p, n: a.host_subnet == "10.5.0.0/16"),
    # IPU-Link domains
    (["--num-ilds=1", "-n", "2"], lambda a, p, n: a.num_ilds == 1),
    (["--num-ilds", "1"], lambda a, p, n: a.num_ilds == 1),
    # V-IPU server and partition options
    (["--vipu-server-host=vipu.lab.internal", "--vipu-server-port=8091",
      "--vipu-server-timeout=600"],
     lambda a, p, n: (env_of(p)["IPUOF_VIPU_API_HOST"], env_of(p)["IPUOF_VIPU_API_PORT"],
                      env_of(p)["IPUOF_VIPU_API_TIMEOUT"]) == ("vipu.lab.internal", "8091", "600")
     and any("no V-IPU server" in x for x in n)),
    (["--vipu-server-host", "10.1.2.3", "--vipu-server-port", "8090", "--vipu-server-timeout",
      "120"], lambda a, p, n: env_of(p)["IPUOF_VIPU_API_HOST"] == "10.1.2.3"),
    (["--vipu-partition=bert-large-16", "--update-partition=yes", "--reset-partition=no",
      "--remove-partition=0"],
     lambda a, p, n: p.job_id == "bert-large-16" and a.update_partition is True
     and a.reset_partition is False and a.remove_partition is False
     and env_of(p)["IPUOF_VIPU_API_PARTITION_ID"] == "bert-large-16"),
    (["--vipu-partition", "p16", "--update-partition", "no", "--reset-partition", "yes",
      "--remove-partition", "1"],
     lambda a, p, n: a.update_partition is False and a.reset_partition and a.remove_partition),
    (["--update-partition", "--reset-partition"],
     lambda a, p, n: a.update_partition is True and a.reset_partition is True),
    (["--vipu-partition-attempts=3"], lambda a, p, n: any("attempts" in x for x in n)),
    (["--vipu-partition-attempts", "2"], lambda a, p, n: a.vipu_partition_attempts == 2),
    (["--vipu-cluster=cl0"], lambda a, p, n: any("--vipu-cluster cl0" in x for x in n)),
    (["--vipu-cluster", "cl0"], lambda a, p, n: a.vipu_cluster == "cl0"),
    (["--vipu-allocation=alloc-3"], lambda a, p, n: any("--vipu-allocation" in x for x in n)),
    (["--vipu-allocation", "alloc-3"], lambda a, p, n: a.vipu_allocation == "alloc-3"),
    # executable cache
    (["--executable-cache-path=/tmp/exe cache"],
     lambda a, p, n: env_of(p)["POPDIST_EXECUTABLE_CACHE_PATH"] == "/tmp/exe cache"),
    (["--executable-cache-path", "/tmp/exe_cache"],
     lambda a, p, n: env_of(p)["POPDIST_EXECUTABLE_CACHE_PATH"] == "/tmp/exe_cache"),
    # Open MPI flags, translated or noted
    (["--mpi-global-args=--allow-run-as-root --tag-output --bind-to none"],
     lambda a, p, n: p.mpirun_args == ("-bind-to", "none")
     and sum("no effect" in x for x in n) == 2),
    (["--mpi-global-args", "--tag-output --map-by socket:PE=4 --report-bindings"],
     lambda a, p, n: p.mpirun_args == ("-map-by", "socket")
     and any("PE=4" in x for x in n) and any("--report-bindings" in x for x in n)),
    (["--mpi-global-args=--mca oob_tcp_if_include lo --mca btl_tcp_if_include lo"],
     lambda a, p, n: p.mpirun_args == ("-iface", "lo")),
    (["--mpi-global-args=--mca oob_tcp_if_include no-such-if9 --tag-output"],
     lambda a, p, n: p.mpirun_args == ()
     and any("no interface 'no-such-if9'" in x and "this machine" in x for x in n)),
    (["--mpi-global-args", "--tag-output \\\n    --bind-to none \\\n    -x A=1"],
     lambda a, p, n: p.mpirun_args == ("-bind-to", "none") and env_of(p)["A"] == "1"),
    # unambiguous prefixes of long options, as Graphcore's parser takes them
    (["--num-instance", "2", "--num-rep=4", "--ipus-per", "2"],
     lambda a, p, n: (p.num_instances, p.num_replicas, p.ipus_per_replica) == (2, 4, 2)),
    (["--only-output=0", "--print-top"],
     lambda a, p, n: p.only_output_from_instance == 0 and a.print_topology is True),
    (["--mpi-global-args", "--mca btl_tcp_if_include 10.0.0.0/8 --mca btl ^openib"],
     lambda a, p, n: p.mpirun_args == () and sum("no effect" in x for x in n) == 2),
    (["--mpi-local-args=-x PYTHONPATH -x LD_LIBRARY_PATH -x POPLAR_LOG_LEVEL=WARN"],
     lambda a, p, n: env_of(p)["POPLAR_LOG_LEVEL"] == "WARN" and "PYTHONPATH" not in env_of(p)),
    (["--mpi-local-args", "--output-filename run-logs -x TF_POPLAR_FLAGS=--use_ipu_model"],
     lambda a, p, n: env_of(p)["TF_POPLAR_FLAGS"] == "--use_ipu_model"
     and any("--output-filename" in x for x in n)),
    (["-n", "2", "--instance-mpi-local-args=1:\"-x SHARD=1 -x ROLE=eval\""],
     lambda a, p, n: p.instance_env_extra == ((1, (("SHARD", "1"), ("ROLE", "eval"))),)),
    (["-n", "2", "--instance-mpi-local-args", "0:-x SHARD=0",
      "--instance-mpi-local-args", "1:-x SHARD=1"],
     lambda a, p, n: [dict(e)["SHARD"] for _, e in p.instance_env_extra] == ["0", "1"]),
    # the rest of Graphcore's switches
    (["--numa-aware=yes"], lambda a, p, n: p.mpirun_args == ("-bind-to", "numa")),
    (["--numa-aware", "1"], lambda a, p, n: a.numa_aware is True),
    (["--print-topology=yes"], lambda a, p, n: a.print_topology is True),
    (["--print-topology", "no"], lambda a, p, n: a.print_topology is False),
    (["--print-topology"], lambda a, p, n: a.print_topology is True),
    (["-n", "4", "--only-output-from-instance=3"],
     lambda a, p, n: p.only_output_from_instance == 3),
    (["--only-output-from-instance", "0"], lambda a, p, n: p.only_output_from_instance == 0),
    (["--offline-mode=yes"], lambda a, p, n: a.offline_mode is True),
    (["--offline-mode", "0"], lambda a, p, n: a.offline_mode is False),
    (["--sync-type=default"], lambda a, p, n: any("--sync-type" in x for x in n)),
    (["--sync-type", "default"], lambda a, p, n: a.sync_type == "default"),
    (["--process-placement=disabled"],
     lambda a, p, n: any("--process-placement" in x for x in n)),
    (["--process-placement", "spreadnuma"], lambda a, p, n: a.process_placement == "spreadnuma"),
    (["--allow-run-as-root", "1"], lambda a, p, n: any("--allow-run-as-root" in x for x in n)),
    (["--allow-run-as-root=yes"], lambda a, p, n: a.allow_run_as_root is True),
    # ipupod's own
    (["--system=POD64", "--launcher=local", "--transport=grpc", "-n", "2"],
     lambda a, p, n: (p.system, p.launcher, p.transport) == ("POD64", "local", "grpc")
     and len(p.job_token) == 32),
    (["--system", "C2-16", "--launcher", "mpirun", "--transport", "mpi"],
     lambda a, p, n: p.system == "C2-16" and p.job_token == ""),
    (["--report-dir=runs/report a"],
     lambda a, p, n: p.report_dir == os.path.abspath("runs/report a")),
    (["--report-dir", "rep", "--system", "BOW-POD16"],
     lambda a, p, n: p.report_dir == os.path.abspath("rep") and p.system == "BOW-POD16"),
    (["--launcher", "local", "--mpi-global-args=--bind-to core"],
     lambda a, p, n: p.mpirun_args == () and any("no effect with --launcher" in x for x in n)),
    # "--" ends the options
    (["-n", "1", "--"], lambda a, p, n: p.command == tuple(PROGRAM)),
]


@pytest.mark.parametrize("argv, check", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_real_world_command_line_becomes_its_plan(argv, check):
    args, plan, notes = plan_of(argv)
    assert check(args, plan, notes), (plan, notes)


def test_every_option_of_the_parser_is_in_the_table():
    used = {word.split("=")[0] for argv, _ in CASES for word in argv if word.startswith("-")}
    used |= {"--import-config", "--export-config", "--overwrite-config", "--version",
             "--version-format", "--help", "--hostfile", "--dry-run"}  # tested below
    options = {s for a in build_parser()._actions for s in a.option_strings}
    short = {"-h", "-H", "-n", "-v"}
    assert options - used - short == set()


def test_the_program_keeps_its_own_options():
    args, program = parse_args(build_parser(), ["-n", "2", "python", "train.py", "-n", "7",
                                                "--host", "x", "--num-instances=9"])
    assert args.num_instances == 2
    assert program == ["python", "train.py", "-n", "7", "--host", "x", "--num-instances=9"]


def test_host_forms():
    assert expand_hosts("node[01-03],gw[0,2]") == ["node01", "node02", "node03", "gw0", "gw2"]
    assert expand_hosts("a:4,b:4") == ["a", "b"]
    assert expand_hosts("rack[1-2]-ipu[0-1]") == ["rack1-ipu0", "rack1-ipu1", "rack2-ipu0",
                                                  "rack2-ipu1"]
    assert is_this_machine("localhost") and is_this_machine("127.0.0.1")
    assert not is_this_machine("pod-host-that-is-not-here")


def test_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the POD's hosts\nhost-a\n\nhost-b slots=4\n")
    _, plan, _ = plan_of(["--hostfile", str(hostfile), "-n", "4"])
    assert plan.hosts == ("host-a", "host-b")
    assert [i.host for i in plan.instances] == ["host-a", "host-a", "host-b", "host-b"]


def test_import_and_export_config(tmp_path, capsys):
    exported = tmp_path / "poprun.json"
    assert poprun_main(["--num-instances=2", "--num-replicas=4", "--export-config",
                        str(exported), "--dry-run", "python", "-V"]) == 0
    data = json.loads(exported.read_text())
    assert data["num-instances"] == 2 and data["num-replicas"] == 4
    # the file does not get overwritten unless asked
    assert poprun_main(["--export-config", str(exported), "--dry-run", "python", "-V"]) == 2
    assert "--overwrite-config" in capsys.readouterr().err
    assert poprun_main(["--export-config", str(exported), "--overwrite-config=yes",
                        "--dry-run", "python", "-V"]) == 0
    # imported values are defaults; the command line wins
    (tmp_path / "in.json").write_text(json.dumps({"num-instances": 4, "num-replicas": 8,
                                                  "ipus-per-replica": 2}))
    args, _ = parse_args(build_parser(), ["--import-config", str(tmp_path / "in.json"),
                                          "--num-replicas", "4", "python", "x.py"])
    assert (args.num_instances, args.num_replicas, args.ipus_per_replica) == (4, 4, 2)


def test_version_and_help(capsys):
    assert poprun_main(["--version"]) == 0
    assert "poprun" in capsys.readouterr().out
    assert poprun_main(["--version", "--version-format=full-json"]) == 0
    assert "python" in json.loads(capsys.readouterr().out)
    assert poprun_main(["--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--mpi-global-args", "--vipu-partition", "--num-ilds", "--only-output-"):
        assert option in out


def test_dry_run_prints_the_topology_and_mpirun_line_and_starts_nothing(tmp_path, capsys):
    marker = tmp_path / "started"
    code = poprun_main(["--dry-run", "-n", "2", "--host", "hostx,hosty", "--print-topology",
                        "python", "-c", f"open({str(marker)!r}, 'w')"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| hosts     | hostx | hosty |" in out
    assert "-hosts hostx:1,hosty:1" in out
    assert not marker.exists()


@pytest.mark.parametrize("argv, message", [
    # the case of the issue: an unknown =-form option whose value has a space
    (["--mpi-global-args=--allow-run-as-root --tag-output", "--unknown-flag=a b"],
     "unknown option '--unknown-flag'"),
    (["--frobnicate"], "unknown option '--frobnicate'"),
    (["-q"], "unknown option '-q'"),
    (["--num-instances"], "unknown option '-c'"),  # 'python' became its value
    (["--dry-run=yes"], "option --dry-run takes no value"),
    (["--mpi-global-args=--np 4"], "--np is not allowed there"),
    (["--mpi-global-args", "--frobnicate-mpi"], "unknown mpirun option '--frobnicate-mpi'"),
    (["--mpi-local-args=--mca pml_ucx_tls any"], "--mca pml_ucx_tls is not known"),
    (["--mpi-global-args=--bind-to sideways"], "--bind-to 'sideways': unknown"),
    (["--mpi-global-args=\"--tag-output"], "No closing quotation"),
    (["--mpi-local-args=-H hostz"], "-H is not allowed there"),
    (["--host", "a,b", "-n", "3"], "--num-instances (3) must be divisible by the number of "
                                   "hosts (2"),
    (["--host", "a[1-"], "unbalanced brackets"),
    (["--host", "a", "--hostfile", "/etc/hosts"], "mutually exclusive"),
    (["--num-ilds", "2"], "--num-ilds 2: "),
    (["--system", "POD16", "--num-ilds", "2"],
     "--num-ilds 2: POD16 has 1 IPU-Link domain of 16 IPUs"),
    (["--num", "2"], "option '--num' is ambiguous and matches '--num-replicas', "
                     "'--num-instances', '--num-ilds', '--numa-aware'"),
    (["--vipu-server", "h"], "is ambiguous and matches '--vipu-server-host'"),
    (["--mpi-global-args=--mca btl_tcp_if_include no-such-if9", "-H", "localhost,far-q",
      "-n", "2"], "this machine has no interface 'no-such-if9' (its interfaces: lo"),
    (["--system", "POD128", "--num-ilds", "2"],
     "--num-ilds 2: the job's 1 IPUs do not split evenly over 2 IPU-Link domains"),
    (["--system", "POD128", "--num-ilds", "2", "--num-replicas", "256"],
     "--num-ilds 2: the job's 256 IPUs over 2 IPU-Link domains put 128 in each, but a "
     "domain of POD128 has 64"),
    (["--num-replicas", "512"], "the job needs 1 instances x 512 replicas x 1 IPUs per "
                                "replica = 512 IPUs, but POD256 has 256 IPUs"),
    (["-n", "2", "--only-output-from-instance", "2"], "there is no instance 2"),
    (["-n", "2", "--instance-mpi-local-args=5:-x A=1"], "there is no instance 5"),
    (["--instance-mpi-local-args=-x A=1"], "expected INSTANCE:ARGS"),
    (["--instance-mpi-local-args=0:--bind-to core"], "whole job only"),
    (["--numa-aware=maybe"], "'maybe' is not yes/no"),
    (["--vipu-server-port=99999"], "must be a port number"),
    (["--vipu-server-timeout=nan"], "finite number of seconds"),
    (["--launcher", "local", "--host", "elsewhere-host"], "are started by mpirun"),
    (["--system", "POD5"], "unknown IPU-POD system 'POD5'"),
    (["--transport", "grpc", "--host", "localhost,far-host-q", "-n", "2"],
     "--host must name this machine by an address the other hosts reach"),
])
def test_a_bad_command_line_exits_2_naming_it_and_starts_nothing(argv, message, tmp_path,
                                                                  capsys):
    marker = tmp_path / "started"
    code = poprun_main([*argv, "python", "-c", f"open({str(marker)!r}, 'w')"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("poprun: error:") and message in err, err
    assert err.count("\n") == 1, err
    assert not marker.exists()


@pytest.mark.parametrize("program", ["no-such-program-anywhere", "./not_here.sh",
                                     "/nonexistent/dir/train"])
def test_a_program_that_is_not_there_exits_2_naming_it(program, capsys):
    assert poprun_main(["-n", "2", program, "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{program!r} is neither an option of poprun nor a program" in err
    assert err.count("\n") == 1


def test_an_option_at_the_end_without_its_value(capsys):
    assert poprun_main(["-n", "2", "--vipu-server-timeout"]) == 2
    err = capsys.readouterr().err
    assert "option --vipu-server-timeout needs a value" in err and err.count("\n") == 1


def test_a_program_on_path_or_a_file_is_found(tmp_path, capsys):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    assert poprun_main(["--dry-run", str(script)]) == 0
    assert poprun_main(["--dry-run", "true"]) == 0


@pytest.fixture
def no_system_named(monkeypatch):
    monkeypatch.delenv("IPUPOD_SYSTEM", raising=False)


@pytest.mark.parametrize("argv, system", [
    (["--num-replicas", "16"], "POD16"),
    (["--num-replicas", "64", "-n", "2"], "POD64"),
    (["--num-replicas", "32", "--ipus-per-replica", "4"], "POD128"),
    (["--num-replicas", "128", "--num-ilds", "2", "-n", "4"], "POD128"),
    (["--num-replicas", "6", "--num-ilds", "3"], "POD256"),
    (["--num-replicas", "512"], "POD256"),      # nothing holds it: the largest says so
    (["--num-replicas", "64", "--num-ilds", "2", "-n", "2"], "POD128"),
    (["--num-replicas", "64", "--num-ilds", "4", "-n", "4"], "POD256"),
    (["--num-replicas", "64", "--system", "BOW-POD64"], "BOW-POD64"),
])
def test_a_job_bigger_than_the_default_runs_on_the_smallest_system_that_holds_it(
        no_system_named, argv, system):
    from poprun.hardware import Said
    args, plan, notes = plan_of(argv)
    assert plan.system == system
    said = [n for n in notes if isinstance(n, Said)]
    if system in ("POD16", "BOW-POD64") or "512" in argv:
        assert not said
    else:
        assert len(said) == 1 and f"running on {system}" in said[0]


@pytest.mark.parametrize("system, ilds", [("POD128", 2), ("POD256", 4)])
def test_a_partition_that_fills_part_of_each_ipu_link_domain_is_accepted(system, ilds, capsys):
    # real launch lines: 64 IPUs over 2 domains of a POD128 (32 in each), over 4 of a POD256
    # (16 in each): V-IPU gives each domain size / num_ilds IPUs
    assert poprun_main(["--dry-run", "--system", system, "--num-ilds", str(ilds), "-n",
                        str(ilds), "--num-replicas", "64", "python", "-c", "1"]) == 0, \
        capsys.readouterr().err


def test_ipupod_system_is_never_overridden(monkeypatch):
    monkeypatch.setenv("IPUPOD_SYSTEM", "POD16")
    assert plan_of(["--num-replicas", "64"])[1].system == "POD16"


def test_the_chosen_system_is_one_line_without_v(no_system_named, capsys):
    assert poprun_main(["--dry-run", "--num-replicas", "64", "-n", "2", "python", "-c",
                        "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "POPRUN [W] the job needs 64 IPUs" in err, err
    assert "running on POD64" in err
