"""Testing distributed IPU code on a laptop or a CI runner, with ipupod's pytest plugin.

    pip install 'ipupod[poptorch]'             # the plugin comes with ipupod
    pytest examples/test_distributed_code.py   # from a checkout: add -p poprun.pytest_plugin

A test marked ``@pytest.mark.poprun(...)`` runs in every instance of an emulated job, started
the way ``poprun`` starts one: its fixtures are set up in each instance, ``popdist``, the
strategies and PopTorch see the job as under ``poprun``, and the test passes when every
instance passes. ``run_job(fn, *args, ...)`` calls a function in every instance and gives
back each instance's return value, to compare them in the test itself.
"""

import hashlib

import numpy as np
import pytest

import ipu_node
from collectives import all_gather, cross_replica_mean, replication_index
from collectives.strategies import PopDistStrategy
from poprun import popdist
from poprun.testing import run_job

# -- 1. data sharding: every sample read once, by one instance ------------------------------


def read_my_shard(num_samples: int) -> list[int]:
    """The sample ids this instance trains on (the code under test: a shard per instance,
    as ``ds.shard(num_shards=popdist.getNumInstances(), index=popdist.getInstanceIndex())``)."""
    ids = np.arange(num_samples)
    return ids[popdist.getInstanceIndex()::popdist.getNumInstances()].tolist()


@pytest.mark.parametrize("num_instances", [2, 4])
def test_the_shards_cover_the_data_set_once(num_instances):
    shards = run_job(read_my_shard, 10, num_instances=num_instances, num_replicas=4)
    assert len(shards) == num_instances                        # one value per instance
    assert sorted(sum(shards, [])) == list(range(10))          # each sample exactly once
    assert all(shards), "an instance got no data"


# -- 2. a collective under PopDistStrategy, in every instance --------------------------------


@pytest.fixture
def strategy():
    """The instance's IPUs as poprun gives them (set up in each instance, not in pytest's
    own process)."""
    config = ipu_node.IPUConfig()
    popdist.set_ipu_config(config, ipus_per_replica=1)
    config.configure_ipu_system()
    yield PopDistStrategy()
    ipu_node.reset_ipu_configuration()


@pytest.mark.poprun(num_instances=2, num_replicas=4, timeout=60)
def test_the_gradients_are_averaged_over_every_replica_of_the_job(strategy):
    assert strategy.num_replicas_in_sync == 4            # 2 instances x 2 local replicas
    with strategy.scope():
        def step():
            r = int(replication_index())                  # global replica index, 0..3
            grads = np.full(3, float(r), np.float32)
            return cross_replica_mean(grads), all_gather(np.float32(r))

        for mean, gathered in strategy.run(step):        # this instance's 2 replicas
            np.testing.assert_array_equal(mean, [1.5, 1.5, 1.5])
            np.testing.assert_array_equal(gathered, [0, 1, 2, 3])


# -- 3. a PopTorch replicated model: every instance ends with the same weights ---------------


def train_replicated(steps: int) -> str:
    """Train a small model on the job's replicas (``popdist.poptorch.Options``); the sha256
    of its weights afterwards."""
    import torch
    import poptorch
    import popdist.poptorch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, y):
            out = self.model(x)
            return out, torch.nn.functional.cross_entropy(out, y)

    opts = popdist.poptorch.Options()                     # this instance's replicas
    training = poptorch.trainingModel(WithLoss(), opts,
                                      torch.optim.SGD(model.parameters(), lr=0.1))
    local, offset = opts.replication_factor, popdist.getReplicaIndexOffset()
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):   # the global batch: 4 replicas x 3 rows; each instance its rows
        x = torch.randn(4, 3, 8, generator=data)
        y = torch.randint(0, 2, (4, 3), generator=data)
        training(x[offset:offset + local].reshape(-1, 8), y[offset:offset + local].reshape(-1))
    training.detachFromDevice()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()


def test_a_poptorch_model_keeps_its_instances_in_sync():
    # the tutorials' check: after training, every instance holds the same weights, bit for bit
    digests = run_job(train_replicated, 3, num_instances=2, num_replicas=4, timeout=120)
    assert len(set(digests)) == 1, digests
