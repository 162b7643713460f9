"""How long the step model takes to price a POD256 step, against an older checkout, in one run.

``what_if(card, config, system="POD256", ...)`` (ResNet-50, 256 replicas) is timed in a fresh
Python process (cold: the POD256's routes and link tables are built in it) and again in the
same process (warm), for this checkout and for a baseline revision exported with
``git archive``; the two run in interleaved rounds and the medians count. The answers of both
are compared (they must be the same floats). Wall seconds on this machine; only the ratios
compare across runs. The cold call's CPU seconds (``time.process_time``) are printed beside
its wall seconds, and the load average with them: on a shared machine the wall time is
mostly waiting for a CPU.

    python benchmarks/pricing_speed.py [--baseline dc73d9f] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: What the step model imports (the baseline exports only these).
_PACKAGES = ("collectives", "ipu_node", "protos")

_PROBE = r"""
import json, time
t0 = time.perf_counter()
from collectives.step_model import ModelCard, StepConfig, predict, what_if
card = ModelCard(25_557_032, 24.5e9, input_bytes_per_item=150_528)
cfg = StepConfig("POD16", 16, micro_batch=20, gradient_accumulation=10, instances=8)
predict(card, cfg)
t1, c1 = time.perf_counter(), time.process_time()
est = what_if(card, cfg, system="POD256", replicas=256, gradient_accumulation=2, instances=128)
t2, c2 = time.perf_counter(), time.process_time()
what_if(card, cfg, system="POD256", replicas=256, gradient_accumulation=3, instances=128)
t3 = time.perf_counter()
print(json.dumps({"cold_s": t2 - t1, "cold_cpu_s": c2 - c1, "warm_s": t3 - t2,
                  "answer": [repr(est.step_s), est.allreduce_method,
                             sorted((k, repr(v)) for k, v in est.breakdown.items())]}))
"""


def _probe(root: str) -> dict:
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=root, env=env, check=True,
                         capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _export(rev: str, into: str) -> str:
    archive = os.path.join(into, "baseline.tar")
    subprocess.run(["git", "-C", _ROOT, "archive", "-o", archive, rev, *_PACKAGES], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(os.path.join(into, "baseline"), filter="data")
    return os.path.join(into, "baseline")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="dc73d9f",
                        help="git revision to compare with (default: before the fast pricing)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base = _export(args.baseline, tmp)
        runs: dict[str, list[dict]] = {"this checkout": [], f"baseline {args.baseline}": []}
        for _ in range(args.rounds):
            runs["this checkout"].append(_probe(_ROOT))
            runs[f"baseline {args.baseline}"].append(_probe(base))
    med = {name: {k: statistics.median(r[k] for r in rs)
                 for k in ("cold_s", "cold_cpu_s", "warm_s")}
           for name, rs in runs.items()}
    answers = {json.dumps(r["answer"]) for rs in runs.values() for r in rs}
    base_name = f"baseline {args.baseline}"
    load = os.getloadavg()
    print(f"what_if(..., system='POD256'), ResNet-50, 256 replicas; median of {args.rounds} "
          f"rounds (wall seconds here; compare the ratios); load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"  {'':<22}{'cold s':>10}{'cold CPU s':>12}{'warm s':>10}")
    for name, m in med.items():
        print(f"  {name:<22}{m['cold_s']:>10.3f}{m['cold_cpu_s']:>12.3f}{m['warm_s']:>10.4f}")
    ratio = med[base_name]["cold_s"] / med["this checkout"]["cold_s"]
    print(f"  speed-up (cold): {ratio:.1f}x; same answers: {len(answers) == 1}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median": med, "speedup_cold": ratio, "same_answers": len(answers) == 1},
                      f, indent=1)
    return 0 if len(answers) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
