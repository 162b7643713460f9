"""Size a BERT-style encoder written in PyTorch for the IPU-PODs, from the model itself.

    python examples/size_bert_poptorch.py                       # a small encoder, 3 steps
    python examples/size_bert_poptorch.py --layers 8 --hidden 256 --steps 2

The encoder is ``torch.nn.TransformerEncoderLayer``s over a token embedding, with a masked-LM
head; ``poptorch.BeginBlock`` cuts its layers evenly over ``--ipus`` IPUs (the embedding on
the first, the head and the loss on the last), ``PipelinedExecution`` runs it. A few training
steps run here for real (PopTorch on CPU PyTorch); ipupod counts the model's FLOPs per stage
from the PyTorch operations and the activations each stage keeps, plans each IPU's memory and
lays out the modelled step (``model.modelReport()``). Then
``collectives.step_model.ModelCard.from_run(run=report)`` makes the run a model card, and
``what_if`` prices the same replica (same IPUs, micro-batch and gradient accumulation) filled
across POD16, POD64, POD128, POD256 and the Bow-PODs: the predicted step time, samples per
second and the breakdown (compute, pipeline bubble, host I/O, all-reduce, weight update) of
each. Memory per IPU is the run's: every replica holds the same.

What the numbers rest on (printed under each table): the chips' datasheet figures
(:mod:`ipu_node.chips`), the model's operations priced one by one on each POD's chip
(:mod:`collectives.performance.compute_model`; ``--efficiency`` prices FLOPs at that share of
peak instead), the collective cost model's links, all counted at this model's size. Nothing
is fitted. ``examples/size_published.py bert-large`` sizes BERT-Large at Graphcore's
published configuration and puts the published throughput beside it.
"""

from __future__ import annotations

import argparse

import torch

import poptorch
from collectives.step_model import ModelCard, StepConfig, what_if
from ipu_node import get_system_model

SYSTEMS = ("POD16", "POD64", "POD128", "POD256", "BOW-POD16", "BOW-POD64", "BOW-POD256")


class Encoder(torch.nn.Module):
    """Token embedding, ``layers`` TransformerEncoderLayers, a masked-LM head and its loss."""

    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, hidden)
        self.position = torch.nn.Parameter(torch.zeros(1, seq, hidden))
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.1,
                                             batch_first=True, norm_first=True)
            for _ in range(layers))
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens, labels):
        x = self.embedding(tokens) + self.position
        for layer in self.layers:
            x = layer(x)
        logits = self.head(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 labels.reshape(-1), ignore_index=-100)
        return loss


def cut(model: Encoder, ipus: int) -> None:
    """The layers evenly over ``ipus`` IPUs (the embedding with the first, the head with the
    last)."""
    per_ipu = -(-len(model.layers) // ipus)
    for i, layer in enumerate(model.layers):
        if i % per_ipu == 0:
            poptorch.BeginBlock(layer, f"layers{i // per_ipu}", ipu_id=i // per_ipu)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--ipus", type=int, default=4, help="IPUs per replica (a power of two)")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--gradient-accumulation", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="training steps run here")
    p.add_argument("--efficiency", type=float, default=None,
                   help="fraction of peak FLOP/s for the predictions (default: priced per "
                        "operation)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = Encoder(args.vocab, args.hidden, args.heads, args.layers, args.seq)
    cut(model, args.ipus)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(args.gradient_accumulation)
    optimizer = poptorch.optim.LAMB(model.parameters(), lr=1e-3)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    rows = args.micro_batch * args.gradient_accumulation
    data = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (rows, args.seq), generator=data)
        labels = torch.where(torch.rand(rows, args.seq, generator=data) < 0.15, tokens,
                             torch.full_like(tokens, -100))
        loss = training(tokens, labels)
        print(f"step {step + 1}/{args.steps} loss={float(loss):.4f}", flush=True)
    report = training.modelReport()
    print()
    print(report.table())
    card = ModelCard.from_run(run=report)
    print(f"\nmodel card from the run: {card}\n")

    print(f"{'system':<11}{'replicas':>9}{'step ms':>11}{'samples/s':>13}")
    estimates = []
    base = StepConfig("POD16", 16 // args.ipus, ipus_per_replica=args.ipus,
                      micro_batch=args.micro_batch,
                      gradient_accumulation=args.gradient_accumulation)
    for system in SYSTEMS:
        replicas = get_system_model(system).num_ipus // args.ipus
        est = what_if(card, base, efficiency=args.efficiency, system=system, replicas=replicas)
        estimates.append(est)
        print(f"{system:<11}{replicas:>9}{est.step_s * 1e3:>11.3f}{est.samples_per_s:>13,.0f}")
    print("\nmemory per IPU of each replica (the run's; every POD above holds the same):")
    for ipu, memory in report.memory.items():
        print(f"  IPU {ipu}: {memory['total'] / 1e6:8.3f} MB of {memory['capacity'] / 1e6:.1f}"
              f" MB: parameters {memory['parameters'] / 1e6:.3f}, optimizer state "
              f"{memory['optimizer_state'] / 1e6:.3f}, accumulators "
              f"{memory['accumulators'] / 1e6:.3f}, activations "
              f"{memory['activations'] / 1e6:.3f}, code and exchange "
              f"{memory['code_and_exchange'] / 1e6:.3f}")
    for est in estimates:
        print()
        print(est.table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
