"""scikit-learn's bundled 8x8 handwritten digits as torch tensors, for notebooks 05 and 06.

The tutorials these notebooks follow train on MNIST through torchvision (a download and a
matching torchvision build); the digits ship inside scikit-learn: 1,797 images of 8x8 pixels,
16 grey levels, ten classes, small enough to train on in seconds. Every rank that calls
``load_digits_split`` with the same ``seed`` gets the same split, so SPMD code needs no
coordination. The file is read straight from scikit-learn's package folder when it is there
(cheaper than importing scikit-learn on every rank at once: ``bench/results/notes.md``);
``load_digits`` is the fallback and the tests' reference.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["DigitsSplit", "accuracy", "load_digits_arrays", "load_digits_split", "shard"]

#: Pixel values in the data set run from 0 to this; dividing by it scales them to [0, 1].
MAX_PIXEL = 16.0


@dataclass(frozen=True)
class DigitsSplit:
    """A train/test split: images ``(N, 1, 8, 8)`` (or ``(N, 64)``) float32, labels int64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    def __repr__(self) -> str:
        shape = "x".join(str(s) for s in self.x_train.shape[1:])
        return (f"DigitsSplit(train={len(self.y_train)}, test={len(self.y_test)}, "
                f"image={shape})")


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits: pixels ``(1797, 64)`` float64 in 0..16 and labels ``(1797,)`` int64.

    The same arrays as ``sklearn.datasets.load_digits()``'s ``data`` and ``target``.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            with gzip.open(csv, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            if table.shape == (1797, 65):
                return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target.astype(np.int64)


def load_digits_split(test_fraction: float = 0.2, seed: int = 0, flat: bool = False,
                      normalize: bool = True) -> DigitsSplit:
    """Load the digits, scale pixels to [0, 1], and split them at random (reproducibly).

    ``normalize`` then shifts and scales every pixel by the mean and standard deviation of all
    training pixels (one number each, as torchvision's ``Normalize`` does for MNIST), which
    lets plain SGD start learning at once. ``flat=True`` gives rows of 64 features instead of
    one-channel 8x8 images. The split is a permutation drawn from a generator seeded with
    ``seed``, so it is the same on every rank.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    pixels, labels = load_digits_arrays()
    x = torch.tensor(pixels, dtype=torch.float32) / MAX_PIXEL
    y = torch.tensor(labels, dtype=torch.int64)
    x = x if flat else x.reshape(-1, 1, 8, 8)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = round(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    if normalize:
        mean, std = x[train].mean(), x[train].std()
        x = (x - mean) / std
    return DigitsSplit(x[train].contiguous(), y[train].contiguous(),
                       x[test].contiguous(), y[test].contiguous())


def shard(x: torch.Tensor, y: torch.Tensor, index: int,
          count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Part ``index`` of ``count`` disjoint parts of ``(x, y)``: rows index, index+count, ..."""
    if not 0 <= index < count:
        raise ValueError(f"shard index must be in 0..{count - 1}, got {index}")
    return x[index::count].contiguous(), y[index::count].contiguous()


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 512) -> float:
    """The fraction of ``x`` that ``model`` labels correctly (eval mode, then restored).

    Inputs go to the device of the model's first parameter (the CPU for a model without any,
    such as a proxy whose weights live in another process); outputs may be on any device.
    """
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    try:
        correct = 0
        for i in range(0, len(y), batch_size):
            out = model(x[i:i + batch_size].to(device))
            correct += int((out.argmax(dim=1).cpu() == y[i:i + batch_size]).sum())
    finally:
        model.train(was_training)
    return correct / len(y)
