"""The generated protos/ modules are up to date with the .proto files, and importable as
protos.xxx_pb2; importing collectives loads no grpc."""

import os
import re
import subprocess
import sys

import pytest

from protos.generate import PROTOS_DIR, generate
from tests.procs import ROOT

# lines that name the generator's version (they change with grpcio-tools, not with the protos)
_VERSION_LINES = re.compile(
    r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s+\d+,\s*$|\s+'',\s*$)",
    re.M)


def _normal(text: str) -> str:
    return _VERSION_LINES.sub("", text)


@pytest.mark.slow  # protoc runs in a process of its own (protos.generate)
def test_generated_modules_are_not_stale(tmp_path):
    pytest.importorskip("grpc_tools", reason="the staleness check needs grpcio-tools")
    for fresh in generate(tmp_path):
        kept = PROTOS_DIR / fresh.name
        assert kept.exists(), f"{kept.name} is missing: run python -m protos.generate"
        assert _normal(fresh.read_text()) == _normal(kept.read_text()), (
            f"protos/{kept.name} is stale against its .proto: run python -m protos.generate")


def test_generated_modules_import_as_package_modules():
    from protos import coordinator_pb2_grpc, peer_pb2_grpc
    assert peer_pb2_grpc.protos_dot_peer__pb2.__name__ == "protos.peer_pb2"
    assert coordinator_pb2_grpc.protos_dot_coordinator__pb2.__name__ == "protos.coordinator_pb2"


@pytest.mark.slow
def test_import_collectives_loads_no_grpc():
    code = ("import sys, collectives, collectives.transports, protos; "
            "print(sorted(m for m in ('grpc', 'mpi4py', 'google.protobuf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"


def test_collectives_does_not_import_launch_or_poprun():
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent / "collectives"
    bad = [str(p) for p in root.rglob("*.py")
           if re.search(r"^\s*(from|import)\s+(launch|poprun)\b", p.read_text(), re.M)]
    assert not bad


_FORK_PROGRAM = r"""
import subprocess, sys, threading
import protos  # first, as in every ipupod process that uses gRPC
import grpc
from concurrent import futures
server = grpc.server(futures.ThreadPoolExecutor(4))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
done = threading.Event()
def busy():
    call = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/ipupod.Test/Nothing")
    while not done.is_set():
        try:
            call(b"", timeout=0.05)
        except grpc.RpcError:
            pass
for _ in range(3):
    threading.Thread(target=busy, daemon=True).start()
codes = [subprocess.run(["true"], close_fds=True, preexec_fn=lambda: None).returncode
         for _ in range(150)]
done.set()
print(sum(c != 0 for c in codes))
"""


@pytest.mark.slow
def test_children_forked_beside_busy_grpc_threads_reach_exec():
    """poprun forks mpirun (``preexec_fn``) while its coordinator serves: with gRPC's fork
    handlers on, a few such children died of SIGABRT before ``exec`` (grpc/grpc#43055);
    importing ``protos`` turns them off, so every child runs."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    result = subprocess.run([sys.executable, "-c", _FORK_PROGRAM], capture_output=True,
                            text=True, timeout=120, env=env, cwd=str(ROOT))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "0", f"children that died: {result.stdout}\n" \
        f"{result.stderr[-2000:]}"
