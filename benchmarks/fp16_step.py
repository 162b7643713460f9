"""A float16 PopTorch model's training step against the same model in float32, in one run.

The same MLP (and a small transformer encoder layer) is trained three ways, one
``trainingModel`` step per call:

  float32        the model as written (the baseline)
  float16        ``model.half()`` with float16 inputs: each float16 operation computed in
                 float32 and rounded to float16 (poptorch.execution._precision, issue 30 item 3)
  float16 native ``model.half()`` stepped by plain PyTorch on CPU float16 kernels (what a
                 float16 program cost before)

The three run in interleaved rounds; the best round counts. Wall seconds on this machine;
only the ratios compare across runs. The goal: float16 at no less than 0.8x the float32
step speed (ratio float32 / float16 >= 0.8).

    python benchmarks/fp16_step.py [--rounds 5] [--steps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0:1] = [_ROOT]

import torch  # noqa: E402


class _MLP(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, 10))

    def forward(self, x, y):
        out = self.net(x)
        return out, torch.nn.functional.cross_entropy(out.float(), y)


class _Encoder(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(width, 8, 4 * width, dropout=0.0,
                                                      batch_first=True)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x, y):
        out = self.head(self.layer(x)[:, 0])
        return out, torch.nn.functional.cross_entropy(out.float(), y)


def _inputs(kind: str, width: int, batch: int):
    g = torch.Generator().manual_seed(0)
    shape = (batch, width) if kind == "mlp" else (batch, 64, width)
    return torch.randn(*shape, generator=g), torch.randint(0, 10, (batch,), generator=g)


def run(kind: str, width: int, batch: int, rounds: int, steps: int) -> dict[str, float]:
    import poptorch
    torch.manual_seed(0)
    base = _MLP(width) if kind == "mlp" else _Encoder(width)
    x, y = _inputs(kind, width, batch)
    n32, n16, native = copy.deepcopy(base), copy.deepcopy(base).half(), \
        copy.deepcopy(base).half()
    m32 = poptorch.trainingModel(n32, poptorch.Options(),
                                 torch.optim.SGD(n32.parameters(), lr=1e-3))
    m16 = poptorch.trainingModel(n16, poptorch.Options(),
                                 torch.optim.SGD(n16.parameters(), lr=1e-3))
    opt = torch.optim.SGD(native.parameters(), lr=1e-3)
    xh = x.half()

    def native_step():
        opt.zero_grad()
        native(xh, y)[1].backward()
        opt.step()

    contenders = {"float32": lambda: m32(x, y), "float16": lambda: m16(xh, y),
                  "float16 native": native_step}
    for fn in contenders.values():
        fn()  # compile / warm up
    best = {name: float("inf") for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / steps)
    m32.destroy()
    m16.destroy()
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    results = {}
    for kind, width, batch in (("mlp", 1024, 256), ("encoder", 256, 32)):
        t = run(kind, width, batch, args.rounds, args.steps)
        results[f"{kind} {width}"] = {
            **t, "float16 speed / float32": t["float32"] / t["float16"],
            "native float16 speed / float32": t["float32"] / t["float16 native"]}
    for name, r in results.items():
        print(f"{name}: step s float32 {r['float32']:.4f}, float16 {r['float16']:.4f}, "
              f"native float16 {r['float16 native']:.4f}; float16 at "
              f"{r['float16 speed / float32']:.2f}x the float32 speed (native: "
              f"{r['native float16 speed / float32']:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
