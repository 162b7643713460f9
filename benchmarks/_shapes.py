"""Shapes and sizes shared by the benchmarks (benchmarks/collectives.py, benchmarks/horovod.py)."""

from __future__ import annotations


def resnet50_gradient_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes of ResNet-50 (He et al. 2016, torchvision's layout: conv weights
    ``[out, in, kh, kw]``, batch-norm scale and offset ``[c]``, the fully connected layer
    ``[1000, 2048]`` and ``[1000]``): 161 tensors, 25,557,032 floats."""
    shapes: list[tuple[int, ...]] = []

    def conv_bn(cin: int, cout: int, k: int) -> None:
        shapes.extend([(cout, cin, k, k), (cout,), (cout,)])

    conv_bn(3, 64, 7)
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            conv_bn(cin, width, 1)
            conv_bn(width, width, 3)
            conv_bn(width, 4 * width, 1)
            if b == 0:
                conv_bn(cin, 4 * width, 1)  # the projection shortcut
            cin = 4 * width
    shapes.extend([(1000, 2048), (1000,)])
    return shapes


def sizes(max_size: int) -> list[int]:
    """Buffer sizes in bytes: 4 KiB, 16 KiB, ... (x4) up to ``max_size``."""
    out, s = [], 4 << 10
    while s <= max_size:
        out.append(s)
        s *= 4
    return out
