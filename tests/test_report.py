"""Run reports (collectives.run_report): JSON, the Trace Event Format trace event by event,
the report at exit under IPUPOD_REPORT_DIR, and the ipupod-report command."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import collectives as C
import collectives.run_report as R
from collectives import report_cli
from collectives._engine.runtime import get_engine
from collectives.step_model import ModelCard
from tests.procs import child_env, describe, run

PROGRAM = """
import numpy as np
import ipu_node, collectives as C
from collectives.strategies import IPUMultiReplicaStrategy
cfg = ipu_node.IPUConfig(); cfg.auto_select_ipus = 2; cfg.configure_ipu_system()
s = IPUMultiReplicaStrategy()
s.run(lambda: C.cross_replica_sum(np.ones(1000, np.float32)))
print("ran")
"""


@pytest.fixture
def run_report(local_system, tmp_path):
    strategy = local_system(4)
    C.reset_stats()
    x = np.ones(1 << 14, np.float32)
    for _ in range(2):
        strategy.run(lambda: C.cross_replica_sum(x))
    strategy.run(lambda: C.all_gather(x[:16]))
    import ipu_node
    system = ipu_node.get_system()
    R.use_model_card(ModelCard(x.size, 1e9, grad_dtype="float32"), micro_batch=4)
    try:
        paths = R.write_report(str(tmp_path), system, get_engine(system).ledger)
    finally:
        R.use_model_card(None)
    with open(paths[0]) as f:
        report = json.load(f)
    with open(paths[1]) as f:
        trace = json.load(f)
    return report, trace, paths


def test_json_report_has_ipus_collectives_and_estimate(run_report):
    report, _, paths = run_report
    assert os.stat(paths[0]).st_mode & 0o777 == 0o600
    assert report["system"] == "POD16" and report["chip"] == "GC200"
    assert report["replicas"] == 4 and len(report["ipus"]) == 4
    rows = {r["op"]: r for r in report["collectives"]}
    assert rows["cross_replica_sum"]["calls"] == 2
    assert rows["cross_replica_sum"]["payload_bytes"] == 2 * 4 * (1 << 14)
    assert rows["cross_replica_sum"]["method"] != "auto"          # the schedule charged
    assert rows["cross_replica_sum"]["modelled_s"] > 0 and rows["all_gather"]["wall_s"] > 0
    for ipu in report["ipus"].values():
        assert set(ipu) == {"compute_s", "copies_s", "collectives_s", "memory_peak_bytes"}
    est = report["step_estimate"]
    assert est["config"]["micro_batch"] == 4 and est["step_s"] > 0
    assert est["breakdown"]["allreduce"] == pytest.approx(
        rows["cross_replica_sum"]["modelled_s"] / 2)
    assert "ipupod report: POD16" in R.summary(report)


def test_trace_event_format_event_by_event(run_report):
    report, trace, _ = run_report
    events = trace["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(meta) + len(slices) == len(events)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta}
    assert names[(R.IPU_PID, 0)] == "IPUs" and names[(R.LINK_PID, 0)] == "links"
    assert {names[(R.IPU_PID, int(i) + 1)] for i in report["ipus"]} == {
        f"IPU {i}" for i in report["ipus"]}
    assert [names[(R.LINK_PID, t + 1)] for t in range(3)] == list(R.LINK_CLASSES)
    assert all(e["name"] in ("process_name", "thread_name") for e in meta)
    calls = [c for c in report["calls"] if c["modelled_s"] > 0]
    # per call: sync + exchange on every IPU, one slice on the IPU-Link track
    assert len(slices) == len(calls) * (2 * len(report["ipus"]) + 1)
    for e in slices:
        assert (e["pid"], e["tid"]) in names                   # every track is named
        assert set(e) >= {"name", "cat", "ts", "dur", "pid", "tid"}
        assert e["ts"] >= 0 and e["dur"] >= 0 and e["cat"] in ("compute", "sync", "exchange")
    tracks: dict[tuple, list] = {}
    for e in slices:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, evs in tracks.items():
        evs.sort(key=lambda e: e["ts"])
        for a, b in zip(evs, evs[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-9, key   # no overlap on a track
    ipu0 = tracks[(R.IPU_PID, int(next(iter(report["ipus"]))) + 1)]
    assert [e["cat"] for e in ipu0[:2]] == ["sync", "exchange"]
    total_us = sum(c["modelled_s"] for c in calls) * 1e6
    assert sum(e["dur"] for e in ipu0) == pytest.approx(total_us)


@pytest.mark.slow
def test_ipupod_report_prints_and_draws(run_report, tmp_path, capsys):
    _, _, paths = run_report
    out = tmp_path / "png"
    assert report_cli.main([paths[0], "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ipupod report: POD16" in text and "step estimate" in text
    assert "no BSP sync or on-chip exchange" in text  # (why it differs from the clock)
    for name in ("report-0-breakdown.png", "report-0-scaling.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert report_cli.main([str(bad)]) == 2
    assert "not an ipupod report" in capsys.readouterr().err
    assert report_cli.main([str(tmp_path / "missing.json")]) == 2


@pytest.mark.slow
def test_a_run_writes_its_report_at_exit(tmp_path):
    env = child_env(IPUPOD_REPORT_DIR=str(tmp_path / "rep"))
    result = run([sys.executable, "-c", PROGRAM], timeout_s=60, env=env)
    assert result.returncode == 0, describe(result)
    assert "ran" in result.stdout and "ipupod report: POD16" in result.stdout, describe(result)
    with open(tmp_path / "rep" / "report-0.json") as f:
        report = json.load(f)
    assert report["collectives"][0]["op"] == "cross_replica_sum"
    assert (tmp_path / "rep" / "trace-0.json").exists()
