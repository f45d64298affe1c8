"""Partitioners: split a call's arguments into ``(rank, args, kwargs)`` triples.

Every partition remembers how many samples it holds (``Partition.size``), so ``mean_reducer``
can weight uneven chunks and return the true batch mean. Partitioners are plain objects of an
importable class: they pickle, and they can be sent to another rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .trees import leaves, tree_map
from .whoami import get_worker_id, get_world_rank, get_world_size

__all__ = [
    "Partition",
    "PartitionFunction",
    "Partitioner",
    "TensorDimensionPartitioner",
    "batch_partitioner",
    "dim_partitioner",
    "exclusive_batch_partitioner",
    "split_sizes",
]


class Partition(tuple):
    """``(rank, args, kwargs)``, unpackable like TorchOpt's triple, plus ``size``.

    ``size`` is the number of samples in this partition (None when the call was not split);
    ``mean_reducer`` uses it as the weight of this partition's result.
    """

    def __new__(cls, rank: int | str, args: tuple, kwargs: dict,
                size: int | None = None) -> Partition:
        self = super().__new__(cls, (rank, args, kwargs))
        self.size = size
        return self

    def __getnewargs__(self) -> tuple:
        return (*self, self.size)

    @property
    def rank(self) -> int | str:
        return self[0]

    @property
    def args(self) -> tuple:
        return self[1]

    @property
    def kwargs(self) -> dict:
        return self[2]

    def __repr__(self) -> str:
        return f"Partition(rank={self[0]!r}, size={self.size!r})"


PartitionFunction = Callable[..., Sequence[tuple]]
Partitioner = int | str | PartitionFunction


def split_sizes(total: int, parts: int) -> list[int]:
    """``total`` samples over ``parts`` chunks as evenly as possible, larger chunks first."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts) if base or i < extra]


class TensorDimensionPartitioner:
    """Split every tensor in the arguments along ``dim``; other values go to every partition.

    - ``exclusive=False``: ``min(batch, len(workers))`` chunks, sizes as even as possible.
    - ``exclusive=True``: one partition per sample; with ``keepdim=False`` the dimension is
      selected away (a ``(T, B, ...)`` batch becomes ``T`` calls on ``(B, ...)``).
    - ``workers``: ranks or names to use, round robin; default every rank of the live world.

    Arguments without a tensor are not split: one partition on this rank.
    """

    def __init__(self, dim: int = 0, *, exclusive: bool = False, keepdim: bool = True,
                 workers: Sequence[int | str] | None = None) -> None:
        if not keepdim and not exclusive:
            raise ValueError("keepdim=False selects one sample per partition, so it needs "
                             "exclusive=True: dim_partitioner(dim, exclusive=True, keepdim=False)")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim must be an int, got {dim!r}")
        self.dim = dim
        self.exclusive = bool(exclusive)
        self.keepdim = bool(keepdim)
        self.workers = None if workers is None else tuple(workers)
        if self.workers is not None and not self.workers:
            raise ValueError("workers is empty; give at least one rank or name, or None for all")

    def _ranks(self) -> list[int]:
        if self.workers is None:
            return list(range(get_world_size()))
        return [get_worker_id(w) for w in self.workers]

    def _batch_size(self, args: tuple, kwargs: dict) -> int | None:
        import torch

        size = None
        for leaf in leaves((args, kwargs)):
            if not isinstance(leaf, torch.Tensor):
                continue
            if leaf.dim() == 0:
                raise ValueError(f"cannot split a 0-d tensor along dim={self.dim}; pass it "
                                 "inside a non-split argument or give it a batch dimension")
            n = leaf.shape[self.dim]
            if size is None:
                size = n
            elif n != size:
                raise ValueError(f"batch size mismatch along dim={self.dim}: one tensor has "
                                 f"{size}, another (shape {tuple(leaf.shape)}) has {n}")
        return size

    def __call__(self, *args: Any, **kwargs: Any) -> list[Partition]:
        import torch

        batch = self._batch_size(args, kwargs)
        if batch is None:
            return [Partition(get_world_rank(), args, dict(kwargs))]
        ranks = self._ranks()
        if self.exclusive:
            pieces = [(i, 1) for i in range(batch)]
        else:
            sizes = split_sizes(batch, min(batch, len(ranks)))
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            pieces = list(zip(starts, sizes, strict=True))
        dim = self.dim

        def cut(start: int, length: int) -> Callable[[Any], Any]:
            def one(leaf: Any) -> Any:
                if not isinstance(leaf, torch.Tensor):
                    return leaf
                if not self.keepdim:
                    return leaf.select(dim, start)
                return leaf.narrow(dim, start, length)
            return one

        out = []
        for i, (start, length) in enumerate(pieces):
            part_args, part_kwargs = tree_map(cut(start, length), (args, kwargs))
            out.append(Partition(ranks[i % len(ranks)], part_args, part_kwargs, length))
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorDimensionPartitioner) and (
            self.dim, self.exclusive, self.keepdim, self.workers) == (
            other.dim, other.exclusive, other.keepdim, other.workers)

    def __hash__(self) -> int:
        return hash((self.dim, self.exclusive, self.keepdim, self.workers))

    def __repr__(self) -> str:
        return (f"dim_partitioner({self.dim}, exclusive={self.exclusive}, "
                f"keepdim={self.keepdim}, workers={self.workers!r})")


def dim_partitioner(dim: int = 0, *, exclusive: bool = False, keepdim: bool = True,
                    workers: Sequence[int | str] | None = None) -> TensorDimensionPartitioner:
    """A partitioner that splits tensors along ``dim`` (see ``TensorDimensionPartitioner``)."""
    return TensorDimensionPartitioner(dim, exclusive=exclusive, keepdim=keepdim, workers=workers)


batch_partitioner = dim_partitioner(0)
"""Split along the first dimension into one chunk per rank (fewer if the batch is smaller)."""

exclusive_batch_partitioner = dim_partitioner(0, exclusive=True)
"""One call per sample along the first dimension, keeping that dimension (size 1)."""
