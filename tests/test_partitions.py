"""Job partitions: poprun reserves a job's IPUs machine-wide, so two jobs never share an IPU."""

import json

import pytest

from ipu_node import get_system_model
from ipu_node.errors import IPUBusyError
from ipu_node.runtime.occupancy import MACHINE_SCOPE, Occupancy
from ipu_node.runtime.partition import reserve_partition
from ipu_node.selection import assign_instance_ipus
from tests.hw_fixtures import isolated  # noqa: F401  (pytest fixture)
from tests.procs import PROGRAMS, describe, run_poprun


@pytest.fixture
def pod16(isolated):  # noqa: F811 - a private occupancy directory (tests/hw_fixtures.py)
    return get_system_model("POD16")


def test_partitions_of_two_jobs_are_disjoint_and_freed(pod16):
    with reserve_partition(pod16, 8, job="a") as a:
        with reserve_partition(pod16, 8, job="b") as b:
            assert set(a.ipus).isdisjoint(b.ipus)
            assert len(a.ipus) == len(b.ipus) == 8
            with pytest.raises(IPUBusyError, match="no 4 free IPUs on POD16"):
                reserve_partition(pod16, 4, job="c")
    with reserve_partition(pod16, 16, job="d") as d:   # both were released
        assert sorted(d.ipus) == list(range(16))


@pytest.mark.parametrize("system, ilds", [("POD128", 2), ("POD256", 4)])
def test_a_partition_over_several_ipu_link_domains_puts_an_even_share_in_each(isolated,  # noqa: F811
                                                                                system, ilds):
    from collectives.performance.cost_model import HardwareCostModel
    model = get_system_model(system)
    share = 64 // ilds
    with reserve_partition(model, 64, job="a", num_ilds=ilds) as a:
        per_domain = [len(set(a.ipus) & set(d)) for d in model.domains]
        assert per_domain == [share] * ilds + [0] * (len(model.domains) - ilds)
        with reserve_partition(model, 64, job="b", num_ilds=ilds) as b:  # the next share
            assert set(a.ipus).isdisjoint(b.ipus)
            assert [len(set(b.ipus) & set(d)) for d in model.domains][:ilds] == [share] * ilds
        # the instances take their IPUs inside it, so the job's replicas cross GW-Links
        instances = assign_instance_ipus(model, ilds, share, within=a.ipus)
        assert [sorted(ipus) for ipus in instances] == [sorted(set(a.ipus) & set(d))
                                                        for d in model.domains[:ilds]]
        spread = HardwareCostModel.for_layout(model, ilds, share, within=a.ipus)
        packed = HardwareCostModel.for_layout(model, ilds, share)   # one domain
        nbytes = 1 << 24
        assert (spread.estimate("cross_replica_sum", nbytes)
                > packed.estimate("cross_replica_sum", nbytes))


def test_a_partition_is_seen_by_programs_started_on_their_own(pod16):
    import ipu_node
    with reserve_partition(pod16, 8, job="a") as a:
        held = {h.ipu_id for h in Occupancy("POD16", MACHINE_SCOPE).holders(all_scopes=False)}
        assert held == set(a.ipus)
        cfg = ipu_node.IPUConfig()
        cfg.system = "POD16"
        cfg.auto_select_ipus = 4
        try:
            system = cfg.configure_ipu_system()
            assert {ipu.id for ipu in system.devices[0].ipus}.isdisjoint(a.ipus)
        finally:
            ipu_node.reset_ipu_configuration()


def test_instances_are_placed_inside_the_partition(pod16):
    within = list(range(8, 16))
    per_instance = assign_instance_ipus(pod16, 2, 2, 2, within=within)
    assert sorted(i for ipus in per_instance for i in ipus) == within
    assert assign_instance_ipus(pod16, 2, 2, 1) == assign_instance_ipus(pod16, 2, 2, 1,
                                                                      within=range(16))


def _attached(tmp_path, *poprun_args):
    out = tmp_path / "ipus"
    out.mkdir()
    result = run_poprun([*poprun_args, "python", str(PROGRAMS / "attached_ipus.py"), str(out)],
                        60, env={"IPUPOD_SYSTEM": "POD16"})
    ipus = [json.loads(p.read_text()) for p in sorted(out.glob("instance_*.json"))]
    return result, ipus


@pytest.mark.slow
def test_a_job_avoids_the_ipus_another_job_holds(pod16, tmp_path):
    with reserve_partition(pod16, 8, job="other") as other:
        result, ipus = _attached(tmp_path, "-n", "2", "--num-replicas", "4")
    assert result.returncode == 0, describe(result)
    attached = [i for instance in ipus for i in instance]
    assert len(attached) == 4 and set(attached).isdisjoint(other.ipus)


@pytest.mark.slow
def test_a_job_that_finds_no_free_ipus_starts_nothing(pod16, tmp_path):
    with reserve_partition(pod16, 16, job="other"):
        result, ipus = _attached(tmp_path, "-n", "2", "--num-replicas", "4")
    assert result.returncode == 1
    assert result.stderr.startswith("poprun: error: no 4 free IPUs on POD16"), describe(result)
    assert ipus == [] and result.stdout == ""


def test_a_dead_holder_whose_pid_lives_on_is_not_listed(pod16, isolated):  # noqa: F811
    """The kernel's lock table decides, not the pid written in the file (pids are reused)."""
    import os
    occupancy = Occupancy("POD16", MACHINE_SCOPE)
    with reserve_partition(pod16, 4, job="a") as a:
        assert {h.ipu_id for h in occupancy.holders(all_scopes=False)} == set(a.ipus)
    stale = json.dumps({"pid": os.getpid(), "command": "gone", "user": "u",
                        "attached_at": 0.0, "device": "d"})
    (isolated / "POD16" / MACHINE_SCOPE / "ipu-0.lock").write_text(stale)
    assert occupancy.holders() == []


@pytest.mark.slow
def test_a_job_leaves_no_lock_files_of_its_own(pod16, isolated, tmp_path):  # noqa: F811
    result, ipus = _attached(tmp_path, "-n", "2", "--num-replicas", "4")
    assert result.returncode == 0, describe(result)
    assert len(ipus) == 2
    scopes = sorted(p.name for p in (isolated / "POD16").iterdir())
    assert scopes == [MACHINE_SCOPE]
