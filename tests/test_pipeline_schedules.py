"""Schedules and the modelled clock: reference execution-model.md §3 O2 (the recorded trace
equals the closed forms) and O3 (modelled time of uniform stages), the S=3 G=6 tables of
§1.2, stash depths, copies priced by ipu_node.routing, the collective hook."""

import numpy as np
import pytest

from ipu_node import clock, get_system
from ipu_node.hardware import routing
from ipu_node.optimizers import GradientDescentOptimizer
from ipu_node.pipelining.schedules import schedule_steps, stash_depths
from ipu_node.pipelining_ops import (OptimizerFunctionOutput, PipelineSchedule, Stage,
                                     last_report, pipeline)
from tests.hw_fixtures import isolated  # noqa: F401
from tests.pipeline_models import ListOutfeed, configure, in_replica

PEAK32 = clock.peak_flops("ipu2", "float32")

# Reference §1.2, Grouped, training, S=3, G=6: per step, per IPU, the passes.
GROUPED_3_6 = [
    ["F0", "", ""], ["F1", "F0", ""], ["F2", "F1", "F0"], ["F3", "F2", "F1 B0"],
    ["F4", "F3 B0", "F2 B1"], ["F5 B0", "F4 B1", "F3 B2"], ["B1", "F5 B2", "F4 B3"],
    ["B2", "B3", "F5 B4"], ["B3", "B4", "B5"], ["B4", "B5", ""], ["B5", "", ""]]
INTERLEAVED_3_6 = [
    ["F0", "", ""], ["", "F0", ""], ["F1", "", "F0"], ["", "F1", "B0"], ["F2", "B0", "F1"],
    ["B0", "F2", "B1"], ["F3", "B1", "F2"], ["B1", "F3", "B2"], ["F4", "B2", "F3"],
    ["B2", "F4", "B3"], ["F5", "B3", "F4"], ["B3", "F5", "B4"], ["", "B4", "F5"],
    ["B4", "", "B5"], ["", "B5", ""], ["B5", "", ""]]


def _uniform_stages(num_stages, f_s, b_s):
    """Stages that pass zero bytes (no copies) and cost f_s / b_s modelled seconds."""
    def fwd(x):
        return (x,), None

    def bwd(saved, d):
        return {}, (d[0],)
    return [Stage(fwd, bwd, flops=f_s * PEAK32, backward_flops=b_s * PEAK32)
            for _ in range(num_stages)]


def _run(num_stages, g, schedule, training=True, f_s=1.0, b_s=1.0, mapping=None):
    def body():
        opt = GradientDescentOptimizer(0.1)
        stages = _uniform_stages(num_stages, f_s, b_s)
        if not training:
            stages = [lambda x: x] * num_stages
        pipeline(stages, g, inputs=[np.zeros(0, np.float32)], outfeed_queue=ListOutfeed(),
                 device_mapping=mapping, pipeline_schedule=schedule,
                 outfeed_mask=[True] if training else None,
                 optimizer_function=(lambda x: OptimizerFunctionOutput(opt, x))
                 if training else None)
        return last_report()
    return in_replica(body)


def _table(report, ipus):
    """The report's passes as the reference's table (one row per step)."""
    steps = max(r.t for r in report.steps if r.kind != "WU") + 1
    rows = [["" for _ in ipus] for _ in range(steps)]
    for r in report.steps:
        if r.kind != "WU":
            cell = rows[r.t][ipus.index(r.ipu)]
            rows[r.t][ipus.index(r.ipu)] = (cell + " " if cell else "") + f"{r.kind}{r.micro_batch}"
    # the reference writes F before B inside a cell
    return [[" ".join(sorted(c.split(), key=lambda p: p[0] != "F")) for c in row]
            for row in rows]


@pytest.mark.parametrize("schedule, table", [(PipelineSchedule.Grouped, GROUPED_3_6),
                                             (PipelineSchedule.Interleaved, INTERLEAVED_3_6)])
def test_o2_the_s3_g6_tables_of_the_reference(isolated, schedule, table):
    configure(ipus_per_replica=4, compute_efficiency=1.0)
    report = _run(3, 6, schedule)
    ipus = [ipu.id for ipu in get_system().devices[0].ipus[:3]]
    assert _table(report, ipus) == table
    wu = [r for r in report.steps if r.kind == "WU"]
    assert sorted(r.ipu for r in wu) == ipus and {r.t for r in wu} == {len(table)}


@pytest.mark.parametrize("num_stages", [2, 3, 4, 5])
@pytest.mark.parametrize("schedule", list(PipelineSchedule))
def test_o2_schedule_steps_follow_the_closed_forms(num_stages, schedule):
    k_total = 2 * num_stages
    g = {PipelineSchedule.Grouped: 2 * k_total, PipelineSchedule.Interleaved: 2 * num_stages,
         PipelineSchedule.Sequential: 3}[schedule]
    steps = schedule_steps(schedule, num_stages, g, training=True)
    form = {PipelineSchedule.Grouped: lambda m, k: m + k,
            PipelineSchedule.Interleaved: lambda m, k: 2 * m + k,
            PipelineSchedule.Sequential: lambda m, k: m * k_total + k}[schedule]
    count = {PipelineSchedule.Grouped: g + k_total - 1,
             PipelineSchedule.Interleaved: 2 * g + 2 * num_stages - 2,
             PipelineSchedule.Sequential: g * k_total}[schedule]
    assert len(steps) == count
    seen = set()
    for t, step in enumerate(steps):
        for p in step:
            k = p.stage if p.kind == "F" else 2 * num_stages - 1 - p.stage
            assert form(p.micro_batch, k) == t
            seen.add((p.kind, p.stage, p.micro_batch))
    assert len(seen) == 2 * num_stages * g  # each stage runs every micro-batch once each way
    # inference: t = m + s for Grouped and Interleaved
    if schedule is not PipelineSchedule.Sequential:
        for t, step in enumerate(schedule_steps(schedule, num_stages, g, training=False)):
            assert all(p.micro_batch + p.stage == t and p.kind == "F" for p in step)


@pytest.mark.parametrize("f_s, b_s", [(1, 1), (1, 2), (2, 1), (3, 5)])
@pytest.mark.parametrize("num_stages, g", [(2, 4), (3, 6), (4, 8)])
def test_o3_modelled_time_of_uniform_stages(isolated, f_s, b_s, num_stages, g):
    configure(ipus_per_replica=4, compute_efficiency=1.0)
    s = num_stages
    cases = {
        PipelineSchedule.Grouped: ((g + s - 1) * (f_s + b_s), (s - 1) / (g + s - 1)),
        PipelineSchedule.Interleaved: (s * f_s + (2 * g - 2) * max(f_s, b_s) + s * b_s, None),
        PipelineSchedule.Sequential: (g * s * (f_s + b_s), (s - 1) / s),
    }
    for schedule, (total, bubble) in cases.items():
        report = _run(s, g, schedule, f_s=f_s, b_s=b_s)
        assert report.total_s == pytest.approx(total, rel=1e-12), schedule
        assert report.compute_phase_s == pytest.approx(total, rel=1e-12)
        if bubble is not None:
            assert report.bubble_fraction == pytest.approx(bubble, rel=1e-9), schedule
        assert all(v == pytest.approx(g * (f_s + b_s)) for v in report.busy_s.values())


def test_o3_bubble_quarter_for_s3_g6_grouped_and_inference_time(isolated):
    configure(ipus_per_replica=4, compute_efficiency=1.0)
    assert _run(3, 6, PipelineSchedule.Grouped).bubble_fraction == pytest.approx(0.25)
    assert _run(3, 6, PipelineSchedule.Interleaved).total_s == pytest.approx(16)
    assert _run(3, 6, PipelineSchedule.Interleaved, b_s=2).total_s == pytest.approx(29)


def test_stash_depths_of_the_reference(isolated):
    configure(ipus_per_replica=4, compute_efficiency=1.0)
    assert _run(3, 6, PipelineSchedule.Grouped).stash_depth == [5, 3, 1]
    assert _run(3, 6, PipelineSchedule.Interleaved).stash_depth == [3, 2, 1]
    assert _run(3, 6, PipelineSchedule.Sequential).stash_depth == [1, 1, 1]


def test_copies_are_priced_by_routing_and_add_to_the_step(isolated):
    """A step costs max compute + max copy (BSP); one stage's activations cross one link."""
    system = configure(ipus_per_replica=2, compute_efficiency=1.0)
    a, b = (ipu.id for ipu in system.devices[0].ipus)
    payload = np.zeros(1 << 18, np.float32)  # 1 MiB

    def body():
        pipeline([Stage(lambda x: ((x,), None), flops=PEAK32), lambda x: None], 2,
                 inputs=[payload], outfeed_queue=ListOutfeed())
        return last_report()
    report = in_replica(body)
    copy = routing.transfer_time_s(system.model, a, b, payload.nbytes)
    first = [r for r in report.steps if r.t == 0]
    assert [r.copy_s for r in first] == [pytest.approx(copy)]
    # steps: F0(0) | F0(1) F1(0) | F1(1): compute 1 s in steps 0 and 1, copies in 0 and 1
    assert report.total_s == pytest.approx(2 * (1 + copy))
    events = clock.timeline(a).events()
    assert [e.peer for e in events if e.kind == "copy"] == [b, b]


def test_collectives_charge_every_local_replica_ipu(isolated):
    from collectives import cross_replica_sum
    from collectives.strategies import IPUMultiReplicaStrategy

    configure(ipus_per_replica=1, replicas=2)
    strategy = IPUMultiReplicaStrategy()
    strategy.run(lambda: cross_replica_sum(np.ones(1024, np.float32)))
    tls = clock.timelines()
    for t in tls.values():
        kinds = [e.kind for e in t.events()]
        assert kinds == ["collective"]
        assert t.events()[0].duration_s > 0
    assert len({t.now_s for t in tls.values()}) == 1
    clock.reset_timelines()
    assert all(not t.events() and t.now_s == 0 for t in clock.timelines().values())
    strategy.run(lambda: cross_replica_sum(np.ones(1024, np.float32)))
    assert all(len(t.events()) == 1 for t in clock.timelines().values())


@pytest.mark.parametrize("num_stages", [1, 2, 3, 4])
@pytest.mark.parametrize("schedule", [PipelineSchedule.Grouped, PipelineSchedule.Sequential])
def test_the_fused_last_stage_of_popart_follows_the_closed_forms(num_stages, schedule):
    """PopART's 2S-1 training stages (poptorch reference §7.2): program k runs micro-batch m
    at t = m + k (Grouped) or m(2S-1) + k (Sequential); F and B of the last stage share a
    step, the forward first."""
    s, g, k_total = num_stages, 2 * num_stages + 1, 2 * num_stages - 1
    steps = schedule_steps(schedule, s, g, training=True, fused_last=True)
    form = (lambda m, k: m + k) if schedule is PipelineSchedule.Grouped else \
        (lambda m, k: m * k_total + k)
    assert len(steps) == (g + k_total - 1 if schedule is PipelineSchedule.Grouped
                          else g * k_total)
    seen = []
    for t, step in enumerate(steps):
        for i, p in enumerate(step):
            k = p.stage if p.kind == "F" else 2 * s - 2 - p.stage
            assert form(p.micro_batch, k) == t
            if p.kind == "B" and p.stage == s - 1:
                assert step[i - 1] == type(p)("F", s - 1, p.micro_batch)
            seen.append((p.kind, p.stage, p.micro_batch))
    assert sorted(seen) == sorted((kind, st, m) for kind in "FB" for st in range(s)
                                  for m in range(g))
    depths = stash_depths(steps, s)
    if schedule is PipelineSchedule.Grouped:  # 2(S-1-s) before the last stage, 1 there
        assert depths == [2 * (s - 1 - st) for st in range(s - 1)] + [1]
    else:
        assert depths == [1] * s
    with pytest.raises(ValueError, match="Interleaved"):
        schedule_steps(PipelineSchedule.Interleaved, s, g, True, fused_last=True)


def test_bsp_step_computes_then_exchanges_and_syncs_every_ipu():
    laid = clock.bsp_step(1.0, [(0, 2.0, "F0", 0, 0, [(1, 0.5)]), (1, 1.0, "F1", 1, 0, []),
                                (1, 0.5, "B1", 1, 0, [(None, 0.25)])], [0, 1, 2], sync=True)
    assert laid.compute_end_s == 3.0 and laid.end_s == 3.5
    kinds = {i: [(e.kind, e.start_s, e.duration_s) for e in evs]
             for i, evs in laid.events.items()}
    assert kinds[0] == [("compute", 1.0, 2.0), ("copy", 3.0, 0.5)]
    assert kinds[1] == [("compute", 1.0, 1.0), ("compute", 2.0, 0.5), ("sync", 2.5, 0.5),
                        ("host_io", 3.0, 0.25), ("sync", 3.25, 0.25)]
    assert kinds[2] == [("sync", 1.0, 2.0), ("sync", 3.0, 0.5)]
    assert laid.events[0][1].peer == 1
