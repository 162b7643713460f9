"""``ipupod-report REPORT.json``: print a run report's summary and draw it to PNG.

    ipupod-report DIR/report-0.json [--out DIR]

Prints :func:`collectives.performance.run_report.summary` and writes two PNG files beside the report (or in
``--out``), drawn with matplotlib's Agg backend (no display needed):

* ``<stem>-breakdown.png``: the step breakdown, the step estimate's terms when the report has
  one (:func:`collectives.performance.run_report.use_model_card`), else the modelled seconds of the run's
  collectives per op and schedule beside the terms a front end's section gives as its
  ``breakdown`` (``poptorch``: each model's stages and modelled step);
* ``<stem>-scaling.png``: what_if over POD sizes (POD16, POD64, POD128, POD256, all IPUs in
  replicas of the run's IPUs per replica; one IPU without a card): samples/s and step time of the report's model card, or without a card
  the modelled seconds of the run's collectives re-priced on every POD.

Exit status: 0, or 2 with a message for a missing or malformed report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "SCALING_SYSTEMS"]

#: PODs of the scaling plot.
SCALING_SYSTEMS = ("POD16", "POD64", "POD128", "POD256")


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            report = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read report {path!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path!r} is not JSON: {exc}") from None
    missing = {"system", "collectives", "ipus", "calls"} - set(report)
    if not isinstance(report, dict) or missing:
        raise ValueError(f"{path!r} is not an ipupod report (missing {sorted(missing)})")
    return report


def _scaling(report: dict) -> tuple[str, list[float], list[float] | None]:
    """(y label, values per POD of SCALING_SYSTEMS, samples/s or None)."""
    from collectives.performance.step_model import ModelCard, StepConfig, predict
    from ipu_node.hardware.systems import get_system_model

    est = report.get("step_estimate")
    if est:
        card = ModelCard(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in est["card"].items()})
        cfg = est["config"]
        steps, rates = [], []
        for name in SCALING_SYSTEMS:
            replicas = get_system_model(name).num_ipus // cfg["ipus_per_replica"]
            e = predict(card, StepConfig(name, replicas, ipus_per_replica=cfg["ipus_per_replica"],
                                         micro_batch=cfg.get("micro_batch", 1),
                                         gradient_accumulation=cfg.get(
                                             "gradient_accumulation", 1)))
            steps.append(e.step_s * 1e3)
            rates.append(e.samples_per_s)
        return "modelled step (ms)", steps, rates
    from collectives.performance.cost_model import HardwareCostModel
    values = []
    for name in SCALING_SYSTEMS:
        cost = HardwareCostModel.for_replicas(get_system_model(name),
                                              get_system_model(name).num_ipus)
        values.append(1e3 * sum(cost.estimate(c["op"], c["nbytes"]) for c in report["calls"]
                                if not c["op"].startswith("host")))
    return "modelled collectives, all IPUs one group (ms)", values, None


def _draw(report: dict, out_dir: str, stem: str) -> tuple[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    est = report.get("step_estimate")
    if est:
        terms = {k: v * 1e3 for k, v in est["breakdown"].items() if k != "host_io"}
        title = f"{report['system']}: modelled step {est['step_s'] * 1e3:.4g} ms"
    else:
        terms = {f"{c['op']}\n{c['method'][:28]}": c["modelled_s"] * 1e3
                 for c in report["collectives"]}
        for section in (report.get("sections") or {}).values():
            if isinstance(section, dict) and isinstance(section.get("breakdown"), dict):
                terms.update({k: v * 1e3 for k, v in section["breakdown"].items()})
        title = f"{report['system']}: modelled collectives and front-end terms of the run"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.barh(list(terms), list(terms.values()), color="tab:blue")
    ax.set_xlabel("modelled ms")
    ax.set_title(title)
    fig.tight_layout()
    breakdown = os.path.join(out_dir, f"{stem}-breakdown.png")
    fig.savefig(breakdown, dpi=100)
    plt.close(fig)

    label, values, rates = _scaling(report)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(SCALING_SYSTEMS, values, marker="o", color="tab:blue", label=label)
    ax.set_ylabel(label)
    k = (est or {}).get("config", {}).get("ipus_per_replica", 1)
    ax.set_xlabel("what_if: POD size (every IPU in a replica"
                  + (f" of {k} IPUs)" if k > 1 else ")"))
    if rates:
        ax2 = ax.twinx()
        ax2.plot(SCALING_SYSTEMS, rates, marker="s", color="tab:orange", label="samples/s")
        ax2.set_ylabel("samples/s")
        ax2.legend(loc="lower right")
    ax.legend(loc="upper left")
    ax.set_title(f"what_if scaling of the {report['system']} run")
    fig.tight_layout()
    scaling = os.path.join(out_dir, f"{stem}-scaling.png")
    fig.savefig(scaling, dpi=100)
    plt.close(fig)
    return breakdown, scaling


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ipupod-report``; returns the exit status."""
    from collectives.performance.run_report import summary

    parser = argparse.ArgumentParser(prog="ipupod-report", description=__doc__.splitlines()[0])
    parser.add_argument("report", help="a report-<instance>.json written by a run")
    parser.add_argument("--out", default=None, help="directory of the PNG files "
                        "(default: the report's)")
    args = parser.parse_args(argv)
    try:
        report = _load(args.report)
    except ValueError as exc:
        print(f"ipupod-report: {exc}", file=sys.stderr)
        return 2
    print(summary(report))
    out = args.out or os.path.dirname(os.path.abspath(args.report))
    os.makedirs(out, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.report))[0]
    for path in _draw(report, out, stem):
        print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
