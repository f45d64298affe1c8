"""Model shapes the benchmarks share (no nbdist here: plain torch children import it)."""

from __future__ import annotations

__all__ = ["resnet50_shapes", "resnet50_tensors"]


def resnet50_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes of torchvision's ``resnet50`` (conv, batch norm weight and
    bias, fc), from the architecture: bottleneck blocks [3, 4, 6, 3], expansion 4."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    return shapes + [(1000, 2048), (1000,)]


def resnet50_tensors(scale: float = 1.0) -> list:
    """ResNet-50's 161 parameters (or gradients) as float32 tensors of ones; ``scale`` < 1
    shrinks every dimension (``--smoke``)."""
    import torch

    shapes = resnet50_shapes()
    if scale != 1.0:
        shapes = [tuple(max(1, int(d * scale)) for d in s) for s in shapes]
    return [torch.ones(s) for s in shapes]
