"""The per-rank Horovod suite (tests/perrank_horovod) under every launcher: plain
``mpirun -n 2`` and ``-n 4``, ``poprun`` with the MPI and the gRPC transport, and
``python -m launch.multiworker`` (TF_CONFIG, gRPC); each job under a hard timeout that kills
its whole process group. Plus the single-process API (rank 0 of 1) in this process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.procs import PYTHON, ROOT, child_env, run

MPIRUN = str(Path(PYTHON).parent / "mpirun")
SUITE = [PYTHON, "-m", "pytest", "tests/perrank_horovod", "-q", "-p", "no:cacheprovider"]


def _run_suite(cmd: list[str], ranks: int, directory: Path) -> None:
    """Every rank ran the whole suite and passed it (each leaves a file: see
    tests/perrank_horovod/conftest.py)."""
    job = run([*cmd, *SUITE], timeout_s=150,
              env=child_env(IPUPOD_HVD_PERRANK="1", HVD_RESULTS_DIR=str(directory)), cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr
    results = {p.name: p.read_text().split() for p in directory.glob("rank_*.txt")}
    assert sorted(results) == [f"rank_{r}.txt" for r in range(ranks)], job.stdout
    counts = {r[0] for r in results.values()}
    assert all(r[1:] == ["0", "0"] for r in results.values()), results
    assert len(counts) == 1 and int(counts.pop()) >= 50, results


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_suite_under_plain_mpirun(ranks, tmp_path):
    _run_suite([MPIRUN, "-n", str(ranks)], ranks, tmp_path)


@pytest.mark.parametrize("launcher", [
    ["-m", "poprun", "-n", "2", "--num-replicas", "4"],
    ["-m", "poprun", "-n", "2", "--num-replicas", "2", "--transport", "grpc"],
    ["-m", "launch.multiworker", "-n", "2"],
], ids=["poprun-mpi", "poprun-grpc", "multiworker"])
@pytest.mark.slow
def test_suite_under_poprun_and_multiworker(launcher, tmp_path):
    _run_suite([PYTHON, *launcher], 2, tmp_path)


@pytest.fixture
def one_rank():
    import collectives.horovod as hvd
    from ipu_node import reset_ipu_configuration
    hvd.init()
    yield hvd
    hvd.shutdown()
    reset_ipu_configuration()


def test_single_process_is_rank_0_of_1(one_rank):
    hvd = one_rank
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.cross_size()) == (0, 1, 0, 1)
    x = np.arange(4, dtype=np.int32)
    np.testing.assert_array_equal(hvd.allreduce(x), x)  # Average over 1 rank
    np.testing.assert_array_equal(hvd.reducescatter(np.ones((3, 2))), np.ones((3, 2)))
    assert hvd.join() == 0
    assert hvd.broadcast_object([1, (2.0, "x")]) == [1, (2.0, "x")]


def test_not_initialized_raises():
    import collectives.horovod as hvd
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="hvd.init"):
        hvd.rank()


def test_objects_encoding_is_safe_and_round_trips():
    from collectives.framework.horovod import _objects
    obj = {"a": [1, 2.5, float("inf")], (1, "k"): b"\x00\xff", None: np.arange(6).reshape(2, 3),
           "s": np.float16(1.5), "t": (True, None)}
    back = _objects.decode(_objects.encode(obj))
    assert back["a"] == [1, 2.5, float("inf")] and back[(1, "k")] == b"\x00\xff"
    np.testing.assert_array_equal(back[None], obj[None])
    assert back["s"] == np.float16(1.5) and isinstance(back["s"], np.float16)
    for bad in (object(), {1, 2}, np.array(["x"], object), lambda: 0):
        with pytest.raises(TypeError):
            _objects.encode(bad)
    with pytest.raises(ValueError):
        _objects.decode(b'{"$nd": "|O", "shape": [1], "scalar": false, "data": ""}')


def test_horovod_scaling_of_integers_truncates_toward_zero():
    from collectives.framework.horovod._data import scale, split_counts
    np.testing.assert_array_equal(scale(np.array([-3, 3, 5], np.int32), 0.5), [-1, 1, 2])
    assert scale(np.array([1.0], np.float16), 1 / 3).dtype == np.float16
    assert split_counts(7, 3) == [3, 2, 2] and split_counts(2, 4) == [1, 1, 0, 0]


def test_the_tf_ipu_horovod_module_has_the_seeds_signatures(one_rank):
    import inspect

    from collectives.ipu import horovod as tf_hvd
    from collectives.ipu.horovod.ipu_horovod_strategy import IPUHorovodStrategy
    from collectives.strategies import IPUHorovodStrategy as Strategy
    assert IPUHorovodStrategy is Strategy
    # seed 004:2071, 2081, 2096
    assert str(inspect.signature(tf_hvd.allreduce)) == "(tensor, op=None)"
    assert str(inspect.signature(tf_hvd.allgather)) == "(tensor, name=None)"
    assert str(inspect.signature(tf_hvd.broadcast)) == "(tensor, root_rank, name=None)"
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(tf_hvd.allreduce(x, tf_hvd.Sum), x)   # op positional
    assert tf_hvd.allreduce(np.float32(2.0)).shape == ()                # op None: Average
    with pytest.raises(NotImplementedError, match="The Adasum reduction is not implemented"):
        tf_hvd.allreduce(x, tf_hvd.Adasum)
    assert tf_hvd.allgather(np.ones((2, 2)), "g").shape == (2, 2)
    assert tf_hvd.broadcast(np.arange(2), 0, "b").tolist() == [0, 1]
    assert (tf_hvd.size(), tf_hvd.rank(), tf_hvd.mpi_built(), tf_hvd.gloo_built()) == (
        1, 0, True, False)


def test_horovod_torchs_positional_order_and_average(one_rank):
    import inspect
    hvd = one_rank
    assert list(inspect.signature(hvd.allreduce).parameters) == [
        "tensor", "average", "name", "compression", "op", "prescale_factor",
        "postscale_factor", "process_set"]
    assert list(inspect.signature(hvd.grouped_allreduce).parameters)[:5] == [
        "tensors", "average", "name", "compression", "op"]
    with pytest.warns(DeprecationWarning, match="Parameter `average` has been replaced with "
                                                "`op` and will be removed in v1.0"):
        assert hvd.allreduce(np.ones(2), False).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(np.ones(2), average=True, op=hvd.Sum)
    assert hvd.allreduce(np.float64(3.0)).shape == ()
    got = hvd.allreduce(np.ones(2, np.float32), compression=hvd.Compression.fp16)
    assert got.dtype == np.float32
    handle = hvd.allreduce_async(np.ones(2), op=hvd.Sum)
    assert hvd.poll(handle) and hvd.synchronize(handle).tolist() == [1.0, 1.0]


def test_agreement_failures_name_the_rank_and_spare_joined_ranks():
    from collectives import CollectiveArgumentError, CollectiveMismatchError
    from collectives.framework.horovod._request import Signature, _failure, error_signature
    ok = Signature("alltoall", {"name": None}, [("float32", [-1])])
    bad = error_signature("alltoall", ValueError("alltoall expects splits to contain 32-bit "
                                                 "integer elements."))
    raise_it = _failure({0: ok, 1: bad}, [False, False], (0, 1))
    with pytest.raises(CollectiveArgumentError, match=r"32-bit integer elements\. \(rank 1's "
                                                      r"hvd\.alltoall"):
        raise_it(ok)
    with pytest.raises(CollectiveMismatchError):   # (the erring rank raises its own)
        raise_it(bad)
    gather = Signature("allgather", {}, [("float32", [-1, 2])])
    raise_it = _failure({1: gather}, [True, False], (0, 1))
    with pytest.raises(CollectiveMismatchError, match="Allgather is not supported with Join "
                                                      "at this time"):
        raise_it(gather)
    assert _failure({1: Signature("allreduce", {"op": "Sum"}, [])}, [True, False],
                    (0, 1)) is None
    assert _failure({0: ok, 1: ok}, [False, False], (0, 1)) is None


@pytest.mark.slow
def test_importing_horovod_imports_no_torch():
    job = run([PYTHON, "-c", "import sys, collectives, collectives.horovod, "
               "collectives.ipu.horovod; sys.exit(1 if 'torch' in sys.modules else 0)"],
              timeout_s=60, env=child_env(), cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr


@pytest.mark.slow
def test_a_torch_job_with_horovod_as_graphcores_poptorch_examples_use_it(tmp_path):
    # reference poptorch.md §8: broadcast_parameters(model.state_dict()) before training, a
    # common seed by hvd.broadcast, metrics by grouped_allreduce/allgather; the examples'
    # sync oracle: every instance's checkpoint the same; and the same training as one
    # instance on the whole batch (up to the rounding of the shards' mean)
    import torch
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    prog = ["-m", "tests.programs.hvd_torch_job"]
    job = run([PYTHON, "-m", "poprun", "-n", "2", PYTHON, *prog, str(two), "4"], timeout_s=120,
              env=child_env(), cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr
    alone = run([PYTHON, *prog, str(one), "4"], timeout_s=120, env=child_env(), cwd=ROOT)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    a, b = (torch.load(two / f"checkpoint-instance-{i}.pt") for i in range(2))
    c = torch.load(one / "checkpoint-instance-0.pt")
    assert a["losses"] == b["losses"]
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
        torch.testing.assert_close(a["state"][key], c["state"][key], rtol=1e-5, atol=1e-6)
    assert "[1,0]<stdout>:RESULT loss" in job.stdout and "[1,1]<stdout>:RESULT" not in job.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["poptorch", "tf"])
def test_hvd_init_under_poprun_before_the_ipu_system_is_configured(mode):
    # Graphcore's programs call hvd.init() first: it configures the system poprun placed the
    # instance on (popdist imported); a PopTorch model then uses that system, and a TF
    # program may configure it again with the same instances without losing Horovod
    job = run([PYTHON, "-m", "poprun", "-n", "2", "--num-replicas", "4", PYTHON, "-m",
               "tests.programs.hvd_first", mode], timeout_s=120, env=child_env(), cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr
    lines = sorted(line.split("RESULT ", 1)[1] for line in job.stdout.splitlines()
                   if "RESULT " in line)
    assert [line.split()[:3] for line in lines] == [[mode, "0", "2"], [mode, "1", "2"]], lines
    if mode == "tf":
        assert all(line.endswith("3 [0, 1]") for line in lines), lines
    else:
        assert lines[0].split()[3] == lines[1].split()[3], lines


@pytest.mark.slow
def test_hvd_init_under_poprun_without_popdist_configures_the_instances_share():
    # nothing registers itself with ipu_node: hvd.init() reads poprun's variables there
    job = run([PYTHON, "-m", "poprun", "-n", "2", PYTHON, "-m", "tests.programs.hvd_first",
               "bare"], timeout_s=120, env=child_env(), cwd=ROOT)
    assert job.returncode == 0, job.stdout + job.stderr
    lines = sorted(line.split("RESULT ", 1)[1] for line in job.stdout.splitlines()
                   if "RESULT " in line)
    assert lines == ["bare 0 2 3 popdist=False", "bare 1 2 3 popdist=False"], job.stdout


def test_hvd_init_under_tf_config_without_a_configured_system_names_what_to_do(monkeypatch):
    import collectives.horovod as hvd
    from ipu_node import reset_ipu_configuration
    from ipu_node.errors import NotConfiguredError
    for name in ("POPDIST_NUM_TOTAL_REPLICAS", "IPUPOD_NUM_INSTANCES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    reset_ipu_configuration()
    with pytest.raises(NotConfiguredError, match=r"started with TF_CONFIG .* "
                                                 r"popdist\.set_ipu_config\(cfg\)"):
        hvd.init()
    assert not hvd.is_initialized()
