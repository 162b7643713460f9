"""Collectives across real instances started by poprun (MPI), each job under a hard timeout
that kills its whole process group:

* the per-rank suite (tests/perrank) under ``poprun -n 2``, ``-n 3`` and ``-n 4``, over
  gRPC at 3 x 6, and its large calls over gRPC at 3 instances;
* the layout-invariance matrix: 1x8 (in-process), 2x4, 4x2, 8x1 (instances x local
  replicas), and 1x6, 2x3, 3x2 (replicas the canonical tree's blocks cut unevenly) give
  bit-identical results for every op, operator, group and dtype;
* divergence between instances: an instance that ends its program, and one that stalls,
  make the job fail fast with an error naming the instance;
* faults found in audits: late peers, caught divergences, and an agreement message that is
  not an ipupod peer's (refused, naming its sender).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from ipu_node import reset_ipu_configuration
from tests.collective_cases import all_cases, assert_same, nest_cases, oracle, packed
from tests.procs import PYTHON, ROOT, child_env, run
from tests.procs import run_poprun as poprun
from tests.perrank import layout_prog


@pytest.mark.slow
@pytest.mark.parametrize("instances, replicas", [(2, 2), (2, 4), (3, 3), (4, 4), (4, 8),
                                                (3, 6)])
def test_per_rank_suite(instances, replicas):
    # (2, 2), (3, 3), (4, 4): one replica per instance (no local rendezvous; at 3, a member
    # in the middle of every exchange and agreement rounds of uneven reach); small calls
    # carry their data in the agreement (collectives._engine.plan) at every layout; (3, 6):
    # groups of 3 cut unevenly by the instances (CONSECUTIVE(3)'s {3, 4, 5}: one replica on
    # instance 1, two on instance 2, which are not one node of the tree of 3)
    job = poprun(["-n", str(instances), "--num-replicas", str(replicas), PYTHON, "-m",
                  "pytest", "tests/perrank", "-q", "-p", "no:cacheprovider"], timeout_s=120)
    assert job.returncode == 0, job.stdout + job.stderr
    # every instance ran the whole suite: the same count, nothing skipped or deselected
    counts = dict(re.findall(r"\[1,(\d+)\]<stdout>:(\d+) passed in ", job.stdout))
    assert sorted(counts) == [str(i) for i in range(instances)], job.stdout
    assert len(set(counts.values())) == 1 and int(counts["0"]) >= 10, job.stdout


@pytest.mark.slow
def test_per_rank_suite_over_grpc_with_groups_cut_unevenly():
    # 3 x 6 over gRPC: instances that send one partial per node of their block
    # (collectives._engine.exchange.Exchange's nodes) through gRPC's alltoallv
    job = poprun(["-n", "3", "--num-replicas", "6", "--launcher", "local", "--transport",
                  "grpc", PYTHON, "-m", "pytest", "tests/perrank", "-q", "-p",
                  "no:cacheprovider"], timeout_s=120)
    assert job.returncode == 0, job.stdout + job.stderr
    counts = dict(re.findall(r"\[1,(\d+)\]<stdout>:(\d+) passed in ", job.stdout))
    assert sorted(counts) == ["0", "1", "2"], job.stdout
    assert len(set(counts.values())) == 1 and int(counts["0"]) >= 10, job.stdout


@pytest.mark.slow
def test_large_calls_over_grpc_at_three_instances():
    # gRPC posts nothing before the agreement: from 3 instances the large calls exchange
    # their data after it, with a member in the middle of the exchange (neither first nor
    # last), against the numpy oracles (a wrong piece order fails them)
    job = poprun(["-n", "3", "--transport", "grpc", PYTHON, "-m", "pytest",
                  "tests/perrank/test_perrank_large.py", "-q", "-p", "no:cacheprovider"],
                 timeout_s=120)
    assert job.returncode == 0, job.stdout + job.stderr
    counts = dict(re.findall(r"\[1,(\d+)\]<stdout>:(\d+) passed in ", job.stdout))
    assert sorted(counts) == ["0", "1", "2"] and len(set(counts.values())) == 1, job.stdout


@pytest.fixture(scope="module")
def single_instance(tmp_path_factory):
    """``results(replicas)``: the directory of the 1 x ``replicas`` run (in-process, made
    once per replica count)."""
    made = {}

    def results(replicas: int):
        if replicas not in made:
            out = tmp_path_factory.mktemp(f"layout-1x{replicas}")
            try:
                layout_prog.main(str(out), replicas)
            finally:
                reset_ipu_configuration()
            made[replicas] = out
        return made[replicas]
    return results


def load(directory, replicas: int) -> list[dict]:
    return [dict(np.load(directory / f"replica{r}.npz")) for r in range(replicas)]


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [8, 6])
def test_single_instance_layout_matches_the_oracle(single_instance, replicas):
    cases = all_cases(replicas)
    nests = nest_cases(replicas)
    for r, results in enumerate(load(single_instance(replicas), replicas)):
        for case in cases:
            assert_same(results[case.key], oracle(case, r, replicas),
                        f"{case.key} on replica {r}")
        for key, members in nests.items():  # a nest call gives each array its own result
            blob, layout = packed([oracle(case, r, replicas) for case in members])
            assert str(results[f"{key}|layout"]) == str(layout), f"{key} on replica {r}"
            assert results[key].tobytes() == blob.tobytes(), f"{key} on replica {r}"


@pytest.mark.slow
@pytest.mark.parametrize("replicas, instances", [(8, 2), (8, 4), (8, 8), (6, 2), (6, 3)])
def test_layouts_are_bit_identical(single_instance, tmp_path, replicas, instances):
    # 6 replicas: blocks the tree cuts (2 x 3: the tree of 6 is [0, 4) + [4, 6); 3 x 2:
    # CONSECUTIVE(3)'s {3, 4, 5} is 1 + 2 of the tree of 3), carried in the agreement,
    # exchanged after it, and nests
    job = poprun(["-n", str(instances), "--num-replicas", str(replicas), PYTHON, "-m",
                  "tests.perrank.layout_prog", str(tmp_path), str(replicas)], timeout_s=120)
    assert job.returncode == 0, job.stdout + job.stderr
    reference, got = load(single_instance(replicas), replicas), load(tmp_path, replicas)
    for r in range(replicas):
        assert reference[r].keys() == got[r].keys()
        for key in reference[r]:
            assert_same(got[r][key], reference[r][key],
                        f"{instances}x{replicas // instances} vs 1x{replicas}: {key} on "
                        f"replica {r}")


FAST = {"IPUPOD_COLLECTIVE_TIMEOUT_S": "3", "IPUPOD_STALL_WARNING_S": "1"}


@pytest.mark.slow
def test_an_instance_that_ends_early_fails_the_job_naming_it():
    job = poprun(["-n", "2", "--num-replicas", "4", PYTHON, "-m",
                  "tests.perrank.diverge_prog", "exit"], timeout_s=60, env=FAST)
    assert job.returncode != 0
    assert "[1,0]<stdout>:RESULT CollectiveMismatchError" in job.stdout, job.stdout + job.stderr
    assert "instance 1 (replicas 2..3) ended its program after 1 collectives" in job.stdout
    assert "cross_replica_sum #1 ('second')" in job.stdout


@pytest.mark.slow
def test_a_stalled_instance_gets_a_warning_then_a_timeout_naming_it():
    job = poprun(["-n", "2", "--num-replicas", "4", PYTHON, "-m",
                  "tests.perrank.diverge_prog", "stall"], timeout_s=25, env=FAST)
    assert job.returncode != 0
    assert "waiting 1.0 s for instance 1 (replicas 2..3)" in job.stderr + job.stdout
    assert "[1,0]<stdout>:RESULT CollectiveTimeoutError" in job.stdout, job.stdout + job.stderr
    assert "waited 3 s for instance 1 (replicas 2..3)" in job.stdout


# -- faults of an MPI job (issue 10's audit): each ends within about the timeout ----------

@pytest.mark.slow
def test_a_peer_late_for_the_first_collective_times_out_after_the_timeout():
    # no communicator exists yet when instance 0 arrives: it must not wait for instance 1
    # (8 s late) in a blocking communicator creation
    job = poprun(["-n", "2", PYTHON, "-m", "tests.programs.mpi_faults", "late-first", "8"],
                 timeout_s=30, env={"IPUPOD_COLLECTIVE_TIMEOUT_S": "3"})
    out = job.stdout + job.stderr
    assert re.search(r"\[1,0\]<stdout>:RESULT CollectiveTimeoutError after [34]\.\d s: "
                     r"cross_replica_sum #0 \('first'\).*waited [34] s for instance 1", out), out
    # and the late one learns at once that instance 0 gave up
    assert re.search(r"\[1,1\]<stdout>:RESULT PeerLostError after [01]\.\d s: instance 0 gave "
                     r"up on the job's collectives \(timed out", out), out


@pytest.mark.slow
def test_a_late_peer_gets_no_result_for_a_call_the_others_gave_up():
    job = poprun(["-n", "2", PYTHON, "-m", "tests.programs.mpi_faults", "late-later", "5"],
                 timeout_s=20, env={"IPUPOD_COLLECTIVE_TIMEOUT_S": "3"})
    out = job.stdout + job.stderr
    # the timeout once, not twice
    assert re.search(r"\[1,0\]<stdout>:RESULT CollectiveTimeoutError after [34]\.\d s", out), out
    # the late instance learns that instance 0 gave up, at once, instead of a result
    assert re.search(r"\[1,1\]<stdout>:RESULT PeerLostError after [01]\.\d s: instance 0 gave "
                     r"up on the job's collectives \(timed out", out), out
    assert "second ok" not in out


@pytest.mark.slow
@pytest.mark.parametrize("timeout_s, steps, looks", [
    ("4", ["0.001", "1.0", "0.1", "0.3", "0.2"], "3 1 3 1 3 1"),  # quiet: 0.25 s
    ("0.2", ["0.05", "0.15", "0.09"], "3 1 3 1")])               # quiet: 0.1 s
def test_an_agreement_soon_after_the_last_looks_once_for_a_notice(timeout_s, steps, looks):
    # a peer that gave up on this call (it waited the timeout) or said it is present (it
    # waited PRESENCE_AFTER_S) would have sent a message after its block: only an agreement
    # that starts so long after the previous one looks behind it (mpi_agreement.quiet_s)
    job = run([PYTHON, "-m", "tests.programs.notice_looks", timeout_s, *steps], timeout_s=30,
              env=child_env())
    assert job.returncode == 0, job.stdout + job.stderr
    assert f"LOOKS {looks}\n" in job.stdout, job.stdout + job.stderr


@pytest.mark.slow
def test_a_caught_divergence_ends_the_job_without_waiting_for_the_timeout():
    # the timeout (60 s) is far beyond the job's hard limit
    job = poprun(["-n", "2", "--num-replicas", "4", PYTHON, "-m", "tests.programs.mpi_faults",
                  "caught-divergence"], timeout_s=20,
                 env={"IPUPOD_COLLECTIVE_TIMEOUT_S": "60"})
    out = job.stdout + job.stderr
    assert "[1,0]<stdout>:RESULT caught CollectiveMismatchError" in out, out
    assert "[1,1]<stdout>:RESULT caught CollectiveMismatchError" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("length", [1 << 40, -8])
def test_a_forged_agreement_message_is_refused_naming_its_sender(length):
    # instance 2 passes on a valid block in round 1, then sends instance 0 a round-2
    # message whose first block claims a payload its message does not hold: a bound, not
    # an IndexError from inside the agreement
    job = poprun(["-n", "4", PYTHON, "-m", "tests.programs.mpi_faults", "forged-round",
                  str(length)], timeout_s=30, env=FAST)
    out = job.stdout + job.stderr
    assert re.search(r"\[1,0\]<stdout>:RESULT TransportError after [01]\.\d s: a malformed "
                     r"agreement message from instance 2: 96 bytes for 2 blocks", out), out
    assert "Traceback" not in out and "IndexError" not in out, out


@pytest.mark.slow
@pytest.mark.parametrize("op", ["cross_replica_sum", "reduce_scatter"])
def test_a_stalled_instance_among_three_is_named_alone(op):
    # the agreement is a reduction, which cannot say who is late; a slow one asks who is there
    # (reduce_scatter: in the rounds of the index agreement, collectives.transports.mpi.index)
    job = poprun(["-n", "3", PYTHON, "-m", "tests.perrank.diverge_prog", "stall", op],
                 timeout_s=25, env=FAST)
    out = job.stdout + job.stderr
    assert job.returncode != 0
    # each of the two others names instance 2: by its own timeout, or, when the other one gave
    # up first and told it so, by the PeerLostError that carries that one's timeout (a race)
    named = r"waited 3 s for instance 2 \(replica 2\); giving up"
    results = {}
    for i in (0, 1):
        found = re.search(rf"\[1,{i}\]<stdout>:RESULT (CollectiveTimeoutError|PeerLostError): "
                          rf"(.*)", out)
        assert found and re.search(named, found.group(2)), out
        results[i] = found.group(1)
    assert "CollectiveTimeoutError" in results.values(), out
    assert not re.search(r"waited \d+ s for instance [01]\b", out), out


# -- an instance that ends its program while the others still call collectives (MPI) -----

ENDED = r"PeerLostError after [12]\.\d s: instance {i} ended its program while this instance"


def _ended_job(mode: str, instances: int):
    """``tests.programs.mpi_ended MODE`` under poprun; its output (it must fail). The
    collective timeout (60 s) is far beyond the job's hard limit (25 s)."""
    job = poprun(["-n", str(instances), PYTHON, "-m", "tests.programs.mpi_ended", mode],
                 timeout_s=25, env={"IPUPOD_COLLECTIVE_TIMEOUT_S": "60"})
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    return out


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["poprun", "mpirun"])
def test_an_instance_that_ends_during_a_horovod_call_is_named_within_seconds(launcher):
    # the collective timeout (60 s) is far beyond the job's hard limit: the Horovod call's
    # agreement meets the ended instance's end of program (one agreement for both), and
    # names it at once, with the words of the MPI transport's notice
    cmd = [PYTHON, "-m", "tests.programs.mpi_ended", "horovod"]
    if launcher == "poprun":
        job = poprun(["-n", "3", *cmd], timeout_s=25,
                     env={"IPUPOD_COLLECTIVE_TIMEOUT_S": "60"})
    else:
        job = run([str(Path(PYTHON).parent / "mpirun"), "-n", "3", *cmd], timeout_s=25,
                  env=child_env(IPUPOD_COLLECTIVE_TIMEOUT_S="60"), cwd=ROOT)
    out = job.stdout + job.stderr
    assert job.returncode != 0, out
    assert re.search(ENDED.replace("[12]", "[0-2]").format(i=2), out), out
    assert "RESULT no error" not in out and "CollectiveTimeoutError" not in out, out


@pytest.mark.slow
def test_an_instance_that_ends_during_a_horovod_call_of_a_process_set_is_named_within_seconds():
    # instances 1 and 2 are a process set: the call of instance 1 is on their communicator,
    # which instance 2's end of program (on every instance's) never reaches: only the ended
    # instance's notice (MPITransport.program_ended) ends the call in time (instance 0
    # computes meanwhile)
    out = _ended_job("horovod-set", 3)
    assert re.search(r"\[1,1\]<stdout>:RESULT " + ENDED.format(i=2), out), out
    assert "RESULT no error" not in out and "CollectiveTimeoutError" not in out, out


@pytest.mark.slow
def test_an_instance_that_ends_before_it_started_mpi_is_named_within_seconds():
    # without the bootstrap's notice the others would wait in MPI_Init for ever
    out = _ended_job("before-mpi", 2)
    assert re.search(r"\[1,0\]<stdout>:RESULT " + ENDED.format(i=1), out), out
    assert "poprun: instance 0 failed" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("instances", [2, 3])
def test_a_caught_error_of_an_ended_instance_ends_the_job_saying_why(instances):
    # the survivors catch the error naming the ended instance and end their program: their
    # end of program does not wait for it (the collective timeout, 60 s, is far beyond the
    # job's hard limit), and every instance's exit status says the job failed
    job = poprun(["-n", str(instances), PYTHON, "-m", "tests.programs.mpi_ended", "caught"],
                 timeout_s=25, env={"IPUPOD_COLLECTIVE_TIMEOUT_S": "60"})
    out = job.stdout + job.stderr
    last = instances - 1
    assert job.returncode != 0, out
    assert "waiting" not in out and "CollectiveTimeoutError" not in out, out
    # the first instance to exit with its reason ends the job (poprun stops the others, which
    # may not have printed theirs yet): the ended one's mismatch or a survivor's end
    ended = rf"instance {last} \(replica {last}\) ended its program after 1 collectives"
    reasons = [rf"\[1,{last}\]<stderr>:replicas disagree on cross_replica_sum #1 "
               rf"\('second'\).*{ended}"]
    reasons += [rf"\[1,{i}\]<stderr>:end of program #2 on instance {i} \(replica {i}\): "
                rf"{ended}, while this instance called 2: the job failed" for i in range(last)]
    assert any(re.search(r, out) for r in reasons), out
    assert re.search(r"poprun: instance \d failed \(exit code 1\)", out), out


@pytest.mark.slow
def test_instances_that_end_one_after_another_end_the_job_without_an_error():
    # the notices of the instances that ended first are the normal end of the job
    job = poprun(["-n", "3", PYTHON, "-m", "tests.programs.mpi_ended", "staggered"],
                 timeout_s=40, env={"IPUPOD_COLLECTIVE_TIMEOUT_S": "60"})
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    assert all(f"RESULT rank {r} ended" in out for r in range(3)), out
    assert "Error" not in out and "ended its program" not in out, out
