"""How long sizing a standard model at its published configuration takes here, end to end.

Each model of ``examples/size_published.py`` is built at Graphcore's published configuration
(ResNet-50 v1.5 at micro-batch 20, 224 x 224, in seven recomputed pieces on one IPU;
BERT-Large phase 1, 24 layers over 4 IPUs, micro-batch 8), compiled in PopTorch (one
micro-batch's forward and backward on the CPU, every operation recorded), made a
``ModelCard`` and priced on its published system: what
``tests/test_sizing_examples.py::test_*_at_its_published_configuration`` run. Each is timed
in a fresh Python process, wall and CPU seconds (``time.process_time``: the process's CPU
time over all its threads), with the load average beside them: on a shared machine the wall
time is mostly waiting for a CPU. The aim: under a minute each on 2 cores.

    python benchmarks/published_configs.py [--models resnet50,bert-large] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROBE = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
sys.path.insert(0, "examples")
import size_published as sized
from collectives.step_model import ModelCard, StepConfig, predict
model = sys.argv[1]
if model == "resnet50":
    training, inputs = sized._resnet(20, 224, accumulation=10)
else:
    training, inputs = sized._bert(8, 24)
training.compile(*inputs)
card = ModelCard.from_run(run=training.modelReport(), **sized.CARD_FIELDS[model])
label, system, replicas, ipus, accumulation, published, _ = sized.PUBLISHED[model][0]
est = predict(card, StepConfig(system, replicas, ipus_per_replica=ipus,
                               micro_batch=sized.MICRO_BATCH[model],
                               gradient_accumulation=accumulation))
training.destroy()
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "label": label, "ratio": est.samples_per_s / published}))
"""


def _probe(model: str) -> dict:
    env = dict(os.environ, PYTHONPATH=_ROOT)
    out = subprocess.run([sys.executable, "-c", _PROBE, model], cwd=_ROOT, env=env,
                         check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert-large")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    results = {}
    for model in args.models.split(","):
        before = os.getloadavg()[0]
        results[model] = dict(_probe(model.strip()), load_before=before,
                              load_after=os.getloadavg()[0])
    print(f"published configurations sized end to end, one fresh process each, on "
          f"{os.cpu_count()} CPUs")
    print(f"  {'model':<12}{'wall s':>9}{'CPU s':>9}{'load':>13}  predicted / published")
    for model, r in results.items():
        print(f"  {model:<12}{r['wall_s']:>9.1f}{r['cpu_s']:>9.1f}"
              f"{r['load_before']:>6.1f}-{r['load_after']:<6.1f}  {r['ratio']:.2f} ({r['label']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
