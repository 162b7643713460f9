"""Collectives over gRPC give the same bytes as over MPI (same canonical reduction order),
for every operator, group and dtype, through poprun --launcher local --transport grpc; and a
training-like program writes the same checkpoint bytes under both."""

import numpy as np
import pytest

from tests.procs import PROGRAMS, poprun

pytestmark = pytest.mark.slow  # whole training jobs (tests/conftest.py)

SUITE = str(PROGRAMS / "collectives_suite.py")
TRAIN = str(PROGRAMS / "train_small.py")


def _load(outdir, instances):
    merged = {}
    for i in range(instances):
        with np.load(outdir / f"instance{i}.npz") as f:
            for k in f.files:
                merged[(i, k) if k in ("broadcast", "reduce_sum", "reduce_mean") else k] = f[k]
    return merged


def _run(tmp_path, name, args, program, instances, **env):
    out = tmp_path / name
    result = poprun([*args, "python", program, str(out)], timeout_s=90, **env)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def suite_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite")
    runs = {
        "grpc_2x2": (["-n", "2", "--num-replicas", "4", "--launcher", "local",
                      "--transport", "grpc"], 2),
        "mpi_2x2": (["-n", "2", "--num-replicas", "4", "--launcher", "mpirun",
                     "--transport", "mpi"], 2),
        "grpc_4x1": (["-n", "4", "--num-replicas", "4", "--launcher", "local"], 4),
    }
    results = {name: _load(_run(tmp, name, args, SUITE, n), n)
               for name, (args, n) in runs.items()}
    results["grpc_2x2_noshm"] = _load(_run(tmp, "grpc_2x2_noshm", runs["grpc_2x2"][0], SUITE,
                                           2, IPUPOD_GRPC_SHM="0"), 2)
    return results


def _same_bytes(a: dict, b: dict, keys=None):
    keys = keys if keys is not None else sorted(set(a) | set(b), key=str)
    differ = [k for k in keys if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes()]
    assert not differ, f"{len(differ)} results differ, e.g. {differ[:5]}"


def test_grpc_equals_mpi_bit_for_bit(suite_results):
    grpc, mpi = suite_results["grpc_2x2"], suite_results["mpi_2x2"]
    assert set(grpc) == set(mpi) and len(grpc) > 150
    _same_bytes(grpc, mpi)


def test_grpc_same_bytes_with_and_without_shared_memory(suite_results):
    """The default (same-host peers move the bytes through shared memory) and
    IPUPOD_GRPC_SHM=0 (every byte in gRPC messages) give the same bytes."""
    _same_bytes(suite_results["grpc_2x2"], suite_results["grpc_2x2_noshm"])


def test_grpc_layouts_agree_bit_for_bit(suite_results):
    """4 instances x 1 replica and 2 x 2 give the same replica results (layout-invariant)."""
    a, b = suite_results["grpc_2x2"], suite_results["grpc_4x1"]
    replica_keys = [k for k in a if isinstance(k, str)]
    _same_bytes(a, b, replica_keys)


def test_grpc_results_match_numpy(suite_results):
    from tests.programs.collectives_suite import data
    res = suite_results["grpc_2x2"]
    inputs = [data(900, r, np.float32) for r in range(4)]
    for r in range(4):
        group = inputs[0:2] if r < 2 else inputs[2:4]
        np.testing.assert_allclose(res[f"cross_replica_sum_k2/r{r}"], group[0] + group[1],
                                   rtol=1e-6)
    for i in range(2):   # broadcast: instance 0's value everywhere
        np.testing.assert_array_equal(res[(i, "broadcast")], data(950, 0, np.float32))


@pytest.mark.slow
def test_training_checkpoints_identical_under_grpc_and_mpi(tmp_path):
    outs = {}
    for name, args in (("grpc", ["--launcher", "local", "--transport", "grpc"]),
                       ("mpi", ["--launcher", "mpirun", "--transport", "mpi"])):
        out = _run(tmp_path, name, ["-n", "2", "--num-replicas", "4", *args], TRAIN, 2)
        outs[name] = [(out / f"ckpt{i}.bin").read_bytes() for i in range(2)]
    assert outs["grpc"][0] == outs["grpc"][1], "instances out of sync under grpc"
    assert outs["mpi"][0] == outs["mpi"][1], "instances out of sync under mpi"
    assert outs["grpc"][0] == outs["mpi"][0], "grpc and mpi checkpoints differ"
