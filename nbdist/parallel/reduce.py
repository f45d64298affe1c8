"""Reducers: combine the partitions' results into one value.

A remote call hands its reducer a ``PartitionResults`` list: the results in partition order,
with ``sizes`` (samples per partition) and ``ranks`` attached. ``mean_reducer`` weights each
result by its size, so the mean of per-chunk means over an uneven split is the true batch
mean; given a plain list (no sizes) it averages equally, as TorchOpt does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["PartitionResults", "mean_reducer", "sum_reducer"]


class PartitionResults(list):
    """The results of a partitioned call, with ``sizes`` and ``ranks`` of their partitions."""

    def __init__(self, results: Iterable[Any] = (), sizes: Sequence[int | None] | None = None,
                 ranks: Sequence[int] | None = None) -> None:
        super().__init__(results)
        self.sizes = None if sizes is None else list(sizes)
        self.ranks = None if ranks is None else list(ranks)
        if self.sizes is not None and len(self.sizes) != len(self):
            raise ValueError(f"{len(self)} results but {len(self.sizes)} sizes")


def _weights(results: Sequence[Any]) -> list[float] | None:
    sizes = getattr(results, "sizes", None)
    if not sizes or any(s is None for s in sizes):
        return None
    total = sum(sizes)
    if total <= 0:
        raise ValueError(f"partition sizes must add up to more than 0, got {sizes}")
    return [s / total for s in sizes]


def _combine(values: list[Any], weights: list[float] | None, how: str) -> Any:
    """Reduce one position of the results: tensors, numbers, or containers of them."""
    import torch

    first = values[0]
    if isinstance(first, (tuple, list)) and not isinstance(first, torch.Tensor):
        if any(len(v) != len(first) for v in values):
            raise ValueError("cannot reduce results of different lengths")
        items = [_combine([v[i] for v in values], weights, how) for i in range(len(first))]
        if hasattr(type(first), "_fields"):
            return type(first)(*items)
        return type(first)(items)
    if isinstance(first, dict):
        return {k: _combine([v[k] for v in values], weights, how) for k in first}
    if isinstance(first, torch.Tensor):
        stacked = torch.stack([torch.as_tensor(v) for v in values], dim=0)
        if how == "sum":
            return stacked.sum(dim=0)
        if weights is None:
            return stacked.mean(dim=0)
        w = torch.tensor(weights, dtype=torch.promote_types(stacked.dtype, torch.float32),
                         device=stacked.device)
        w = w.reshape((-1,) + (1,) * (stacked.dim() - 1))
        return (stacked * w).sum(dim=0)
    if isinstance(first, (int, float, complex)) and not isinstance(first, bool):
        if how == "sum":
            return sum(values)
        if weights is None:
            return sum(values) / len(values)
        return sum(v * w for v, w in zip(values, weights, strict=True))
    raise TypeError(f"cannot {how}-reduce results of type {type(first).__name__}; return "
                    "tensors or numbers (or tuples/dicts of them), or pass your own reducer")


def mean_reducer(results: Iterable[Any]) -> Any:
    """The mean of the results, weighted by partition size when the sizes are known.

    With ``PartitionResults`` from a split batch this is the true batch mean of per-chunk
    means, however unevenly the batch was split. Tuples and dicts are reduced item by item.
    """
    values = results if isinstance(results, list) else list(results)
    if not values:
        raise ValueError("mean_reducer got no results to reduce")
    return _combine(list(values), _weights(values), "mean")


def sum_reducer(results: Iterable[Any]) -> Any:
    """The sum of the results (tensors, numbers, or tuples/dicts of them)."""
    values = list(results)
    if not values:
        raise ValueError("sum_reducer got no results to reduce")
    return _combine(values, None, "sum")
