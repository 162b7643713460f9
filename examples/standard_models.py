"""Standard models written in plain PyTorch for the sizing examples (no torchvision or
transformers needed): ResNet-50 v1.5 and a BERT encoder for pre-training.

* :func:`resnet50`: ResNet-50 v1.5 as torchvision builds it (He et al. 2016, with the v1.5
  stride on the 3x3 convolution of each bottleneck: the form MLPerf trains): 25,557,032
  parameters at 1000 classes.
* :class:`Bert`: BERT (Devlin et al. 2019) as Graphcore's pre-training examples build it:
  word, position and token-type embeddings, ``layers`` post-norm encoder layers (self-
  attention of ``heads`` heads, GELU feed-forward of 4 x hidden), the masked-LM head tied to
  the word embedding and the next-sentence head; ``Bert.large()`` is BERT-Large (24 layers,
  1024 hidden, 16 heads, vocabulary 30,522: about 335 million parameters). The attention is
  written with ``matmul`` and ``softmax`` (the operations PopTorch lowers), the masked-LM
  head computes only the masked positions (``mask_tokens`` of them), as Graphcore's does.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["resnet50", "Bert", "Bottleneck", "ResNet"]


class Bottleneck(nn.Module):
    """1x1, 3x3 (stride here: v1.5), 1x1 convolutions with batch norms, a residual."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet of bottleneck blocks; ``forward(images, labels)`` returns the loss (as a
    PopTorch training model does)."""

    def __init__(self, blocks=(3, 4, 6, 3), classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for i, n in enumerate(blocks):
            width = 64 * 2 ** i
            for j in range(n):
                layers.append(Bottleneck(cin, width, stride=2 if j == 0 and i > 0 else 1))
                cin = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, images, labels):
        x = self.layers(self.stem(images))
        logits = self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
        return nn.functional.cross_entropy(logits, labels)


def resnet50(classes: int = 1000) -> ResNet:
    """ResNet-50 v1.5 (25,557,032 parameters at 1000 classes)."""
    return ResNet((3, 4, 6, 3), classes)


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, 4 * hidden)
        self.ff2 = nn.Linear(4 * hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x, mask):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(
            2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(h // self.heads) + mask
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        x = self.norm1(x + self.out(context.transpose(1, 2).reshape(b, s, h)))
        return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class Bert(nn.Module):
    """BERT for pre-training (module docstring). ``forward(tokens, types, mask, positions,
    labels, nsp_labels)``: ``tokens``/``types`` ``[B, S]`` int64, ``mask`` ``[B, S]`` (1:
    attend), ``positions`` ``[B, P]`` the masked positions, ``labels`` ``[B, P]`` their
    tokens, ``nsp_labels`` ``[B]``; returns the MLM + NSP loss."""

    def __init__(self, vocab: int = 30522, hidden: int = 1024, heads: int = 16,
                 layers: int = 24, seq: int = 128):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.embed_norm = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(_Layer(hidden, heads) for _ in range(layers))
        self.transform = nn.Linear(hidden, hidden)
        self.transform_norm = nn.LayerNorm(hidden)
        self.mlm_bias = nn.Parameter(torch.zeros(vocab))
        self.pooler = nn.Linear(hidden, hidden)
        self.nsp = nn.Linear(hidden, 2)

    @classmethod
    def large(cls, seq: int = 128) -> "Bert":
        return cls(30522, 1024, 16, 24, seq)

    def embed(self, tokens, types):
        pos = torch.arange(tokens.shape[1]).unsqueeze(0)
        return self.embed_norm(self.word(tokens) + self.position(pos) + self.token_type(types))

    def heads_loss(self, x, positions, labels, nsp_labels):
        picked = torch.gather(x, 1, positions.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        h = self.transform_norm(nn.functional.gelu(self.transform(picked)))
        logits = torch.matmul(h, self.word.weight.t()) + self.mlm_bias
        mlm = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                          labels.reshape(-1))
        nsp = nn.functional.cross_entropy(self.nsp(torch.tanh(self.pooler(x[:, 0]))),
                                          nsp_labels)
        return mlm + nsp

    def forward(self, tokens, types, mask, positions, labels, nsp_labels):
        x = self.embed(tokens, types)
        additive = (1.0 - mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, additive)
        return self.heads_loss(x, positions, labels, nsp_labels)

    @staticmethod
    def batch(micro_batch: int, seq: int = 128, masked: int = 20, vocab: int = 30522,
              seed: int = 0) -> tuple:
        """A random batch of ``micro_batch`` sequences (the shapes of phase 1: 128 tokens,
        20 masked)."""
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, vocab, (micro_batch, seq), generator=g),
                torch.randint(0, 2, (micro_batch, seq), generator=g),
                torch.ones(micro_batch, seq, dtype=torch.int64),
                torch.randint(0, seq, (micro_batch, masked), generator=g),
                torch.randint(0, vocab, (micro_batch, masked), generator=g),
                torch.randint(0, 2, (micro_batch,), generator=g))
