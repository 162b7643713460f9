"""The one pipeline scheduler and the one pricer of every front end
(ipu_node.pipelining.scheduler, ipu_node.pipelining.pricing): the passes run in the
schedule's order through the front end's callbacks, errors stop the run, and the pricer's
transfers, BSP steps, account and replay are those of ipu_node's clock and routing."""

import threading

import pytest

from ipu_node import clock
from ipu_node.clock import Timeline
from ipu_node.hardware import routing
from ipu_node.hardware.systems import get_system_model
from ipu_node.pipelining.pricing import PipelinePricer, PricedSteps
from ipu_node.pipelining.scheduler import PipelineScheduler
from ipu_node.pipelining.schedules import PipelineSchedule, schedule_steps

CASES = [(schedule, stages, g, training, fused)
         for schedule in PipelineSchedule for stages in (1, 2, 3) for g in (0, 6)
         for training in (True, False) for fused in (False, True)
         if not (fused and schedule is PipelineSchedule.Interleaved)]


@pytest.mark.parametrize("schedule,stages,g,training,fused", CASES)
def test_the_callbacks_run_every_pass_in_the_schedules_order(schedule, stages, g, training,
                                                             fused):
    ran = []
    scheduler = PipelineScheduler(schedule, stages, fused_last=fused)
    scheduler.run(g, training, lambda s, m: ran.append(("F", s, m)),
                  lambda s, m: ran.append(("B", s, m)))
    expected = [(p.kind, p.stage, p.micro_batch)
                for step in schedule_steps(schedule, stages, g, training, fused_last=fused)
                for p in step]
    assert ran == expected
    assert scheduler.steps(g, training) is scheduler.steps(g, training)  # made once


def test_on_step_gets_each_steps_passes_and_what_their_callbacks_returned():
    scheduler = PipelineScheduler(PipelineSchedule.Grouped, 2, fused_last=True)
    seen = []
    scheduler.run(3, True, lambda s, m: f"f{s}.{m}", lambda s, m: f"b{s}.{m}",
                  on_step=lambda t, results: seen.append((t, results)))
    steps = scheduler.steps(3, True)
    assert [t for t, _ in seen] == list(range(len(steps)))
    for (_, results), step in zip(seen, steps):
        assert [p for p, _ in results] == step
        assert [r for _, r in results] == [f"{p.kind.lower()}{p.stage}.{p.micro_batch}"
                                           for p in step]


def test_an_exception_of_a_pass_stops_the_run_and_reaches_the_caller():
    ran = []

    def forward(s, m):
        ran.append((s, m))
        if (s, m) == (1, 1):
            raise KeyError("boom")
    with pytest.raises(KeyError, match="boom"):
        PipelineScheduler(PipelineSchedule.Sequential, 2).run(3, False, forward)
    assert ran == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_stages"):
        PipelineScheduler(PipelineSchedule.Grouped, 0)
    with pytest.raises(ValueError, match="Interleaved"):
        PipelineScheduler(PipelineSchedule.Interleaved, 2, fused_last=True)
    scheduler = PipelineScheduler(PipelineSchedule.Grouped, 2)
    with pytest.raises(ValueError, match="micro-batches"):
        scheduler.run(-1, False, lambda s, m: None)
    with pytest.raises(ValueError, match="backward"):
        scheduler.run(2, True, lambda s, m: None)


def test_the_pricers_transfers_are_routing_s():
    model = get_system_model("POD16")
    pricer = PipelinePricer(model, [0, 5])
    for src, dst in ((0, 1), (0, 5), (5, 0), (3, 12)):
        assert pricer.copy_s(src, dst, 12345) == routing.transfer_time_s(model, src, dst, 12345)
        assert pricer.copy_s(src, dst, 12345) == routing.transfer_time_s(model, src, dst, 12345)
    assert pricer.copy_s(3, None, 4096) == routing.host_transfer_time_s(model, 3, 4096)
    assert pricer.copy_s(0, 0, 100) == pricer.copy_s(0, 1, 0) == 0.0
    assert PipelinePricer(None, [0]).copy_s(0, 1, 100) == 0.0


def test_the_pricer_lays_bsp_steps_and_keeps_their_account():
    steps = [[(0, 2.0, "F0", 0, 0, [(1, 0.5)])],
             [(0, 1.0, "F0", 0, 1, [(1, 0.5)]), (1, 3.0, "F1", 1, 0, [(None, 0.25)])]]
    pricer = PipelinePricer(None, [0, 1], sync=True)
    pricer.host_step([(0, 0.0, "host input", 0, None, [(None, 0.125)])])
    t, expected = 0.125, {0: [], 1: []}
    for passes in steps:
        laid = clock.bsp_step(t, passes, [0, 1], sync=True)
        assert pricer.step(passes) == laid
        for i, evs in laid.events.items():
            expected[i] += evs
        t = laid.end_s
    assert pricer.now_s == t == 0.125 + 2.5 + 3.5
    assert pricer.host_s == 0.125
    assert pricer.compute_phase_s == 2.0 + 3.0 and pricer.exchange_s == 0.5 + 0.5
    assert pricer.busy_s == {0: 3.0, 1: 3.0}
    assert pricer.bubble_fraction == pytest.approx(1 - 6.0 / (2 * 5.0))
    priced = pricer.priced({0: 7, 1: 8})
    assert priced.total_s == t and priced.busy_s == {7: 3.0, 8: 3.0}
    assert priced.bubble_fraction == pricer.bubble_fraction
    assert [e for e in priced.events[7] if e.kind != "host_io"] == expected[0]


def test_priced_steps_replay_on_timelines_from_their_latest_clock():
    pricer = PipelinePricer(None, [0, 1], sync=True)
    pricer.step([(0, 2.0, "F0", 0, 0, [(1, 0.5)]), (1, 1.0, "F1", 1, 0, [])])
    priced = pricer.priced()
    tls = {0: Timeline(0), 1: Timeline(1)}
    tls[1].add("compute", 4.0, "before")
    for _ in range(2):
        start = max(t.now_s for t in tls.values())
        n = {i: len(t.events()) + (t.now_s < start) for i, t in tls.items()}  # + a sync
        priced.replay(tls)
        for i, t in tls.items():
            new = t.events()[n[i]:]
            assert [e._replace(start_s=e.start_s - start) for e in new] == priced.events[i]
            assert t.now_s == start + priced.total_s
    assert tls[0].events()[0] == clock.Event(0.0, 4.0, "sync", "sync")
    assert PricedSteps().bubble_fraction == 0.0


def test_replica_threads_share_one_scheduler():
    scheduler = PipelineScheduler(PipelineSchedule.Grouped, 3, fused_last=True)
    expected = [(p.kind, p.stage, p.micro_batch)
                for step in schedule_steps(PipelineSchedule.Grouped, 3, 5, True,
                                           fused_last=True) for p in step]
    barrier, ran = threading.Barrier(4), {}

    def replica(r):
        mine = ran[r] = []
        barrier.wait()  # all four make the steps of g=5 at once
        scheduler.run(5, True, lambda s, m: mine.append(("F", s, m)),
                      lambda s, m: mine.append(("B", s, m)))
    threads = [threading.Thread(target=replica, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(ran[r] == expected for r in range(4))
