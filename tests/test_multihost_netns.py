"""A real two-host job: poprun --host across two network namespaces of this machine.

The test makes two network namespaces joined by a veth pair, each end named ``ipp0`` with a
private address (10.77.0.1/24 and 10.77.0.2/24) that exists only inside its namespace, so no
traffic leaves them. poprun runs in the first namespace ("host A"); Hydra's ssh launcher is
pointed (``HYDRA_LAUNCHER_EXEC``, Hydra's variable for ``-launcher-exec``) at a small wrapper
that runs the command inside the namespace of the host it is given, as ssh would run it on
that host. Hydra starts host A's instances itself. The hosts share the file system, as hosts
with the same venv path do. Needs root (``ip netns add``), which CI has; skips saying why
otherwise. The namespaces are removed in a ``finally``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.procs import PROGRAMS, PYTHON, ROOT, describe, run, run_poprun

pytestmark = pytest.mark.slow  # starts processes (tests/conftest.py)

HOST_A, HOST_B = "10.77.0.1", "10.77.0.2"
IFACE = "ipp0"
EXAMPLE = str(ROOT / "examples" / "train_digits.py")

WRAPPER = """#!/bin/sh
# Hydra's ssh launcher calls: <this> [ssh options] HOST COMMAND...; run COMMAND in HOST's netns.
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
echo "$host" >> {log}
case $host in
  {a}) ns={ns_a};;
  {b}) ns={ns_b};;
  *) echo "no such host: $host" >&2; exit 255;;
esac
exec ip netns exec "$ns" sh -c "$*"
"""

WHERE = ("import os, json; from poprun import popdist; "
         "print(json.dumps([popdist.getInstanceIndex(), popdist.getLocalInstanceIndex(), "
         "os.readlink('/proc/self/ns/net')]))")


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode:
        raise OSError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _why_not() -> str | None:
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing: apt-get install iproute2"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add); CI runs as root"
    return None


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """(ns_a, ns_b, env for poprun, wrapper log)."""
    why = _why_not()
    if why:
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"ipupod-{tag}-a", f"ipupod-{tag}-b"
    tmp = tmp_path_factory.mktemp("netns")
    log = tmp / "launched"
    wrapper = tmp / "netns-ssh"
    wrapper.write_text(WRAPPER.format(log=log, a=HOST_A, b=HOST_B, ns_a=ns_a, ns_b=ns_b))
    wrapper.chmod(0o700)
    made = []
    try:
        for ns in (ns_a, ns_b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", f"ippa{tag}", "type", "veth", "peer", "name", f"ippb{tag}")
        for ns, end, address in ((ns_a, f"ippa{tag}", HOST_A), (ns_b, f"ippb{tag}", HOST_B)):
            _ip("link", "set", end, "netns", ns)
            _ip("-n", ns, "link", "set", end, "name", IFACE)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except OSError as exc:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], timeout=30)
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield ns_a, ns_b, {"HYDRA_LAUNCHER_EXEC": str(wrapper)}, log
    finally:  # the veth pair goes with its namespaces
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], timeout=30)


def _poprun_on_a(ns_a: str, env: dict, args: list[str], timeout_s: float):
    return run(["ip", "netns", "exec", ns_a, PYTHON, "-m", "poprun",
                "--host", f"{HOST_A},{HOST_B}",
                f"--mpi-global-args=--mca oob_tcp_if_include {IFACE} --tag-output", *args],
               timeout_s, env={**os.environ, **env}, cwd=ROOT)


def _netns_id(ns: str) -> str:
    return f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]"


def test_instances_run_on_their_hosts_in_order(two_hosts):
    ns_a, ns_b, env, log = two_hosts
    log.write_text("")
    result = _poprun_on_a(ns_a, env, ["-n", "4", "--print-topology", "python", "-c", WHERE], 90)
    assert result.returncode == 0, describe(result)
    seen = sorted(json.loads(line.split(":", 1)[1]) for line in result.stdout.splitlines()
                  if line.startswith("[1,"))
    a, b = _netns_id(ns_a), _netns_id(ns_b)
    assert seen == [[0, 0, a], [1, 1, a], [2, 0, b], [3, 1, b]], describe(result)
    # host A is this machine: Hydra started its instances without the ssh launcher
    assert set(log.read_text().split()) == {HOST_B}
    assert f"| hosts     | {HOST_A}" in result.stdout


def test_the_main_job_across_two_hosts_trains_as_on_one(two_hosts, tmp_path):
    ns_a, _, env, _ = two_hosts
    args = ["python", EXAMPLE, "--epochs", "2"]
    result = _poprun_on_a(ns_a, env, ["-n", "2", "--num-replicas", "4", *args,
                                      "--checkpoint-dir", str(tmp_path / "two")], 180)
    assert result.returncode == 0, describe(result)
    single = run_poprun(["-n", "1", "--num-replicas", "4", *args, "--checkpoint-dir",
                         str(tmp_path / "one")], 180)
    assert single.returncode == 0, describe(single)
    one = dict(np.load(tmp_path / "one" / "instance_0.npz"))
    for i in range(2):
        two = dict(np.load(tmp_path / "two" / f"instance_{i}.npz"))
        assert two.keys() == one.keys()
        for k in one:
            assert two[k].tobytes() == one[k].tobytes(), (i, k)


def test_the_collectives_suite_across_two_hosts(two_hosts, tmp_path):
    ns_a, _, env, _ = two_hosts
    suite = str(PROGRAMS / "collectives_suite.py")
    result = _poprun_on_a(ns_a, env, ["-n", "2", "--num-replicas", "4", "python", suite,
                                      str(tmp_path / "two")], 180)
    assert result.returncode == 0, describe(result)
    local = run_poprun(["-n", "2", "--num-replicas", "4", "python", suite,
                        str(tmp_path / "one")], 180)
    assert local.returncode == 0, describe(local)
    for i in range(2):
        two = np.load(Path(tmp_path / "two" / f"instance{i}.npz"))
        one = np.load(Path(tmp_path / "one" / f"instance{i}.npz"))
        assert sorted(two.files) == sorted(one.files) and len(one.files) > 50
        for k in one.files:
            assert two[k].dtype == one[k].dtype and two[k].tobytes() == one[k].tobytes(), k


def test_the_grpc_transport_across_two_hosts(two_hosts, tmp_path):
    """The coordinator listens on host A's address, each instance's peer server on its own
    host's; the job token reaches host B through Hydra's environment, on no command line."""
    ns_a, _, env, _ = two_hosts
    suite = str(PROGRAMS / "collectives_suite.py")
    result = _poprun_on_a(ns_a, env, ["-n", "2", "--num-replicas", "4", "--transport", "grpc",
                                      "--launcher", "mpirun", "python", suite,
                                      str(tmp_path / "grpc")], 180)
    assert result.returncode == 0, describe(result)
    assert result.stdout.count("results over grpc") == 2, describe(result)
