"""``nbdist.parallel``: TorchOpt's ``torchopt.distributed`` API, made to work in a notebook.

``import nbdist.parallel as todist`` runs TorchOpt's distributed examples unchanged once a world
is up (``%dist_start N``, or ``@todist.auto_init_rpc()`` under torchrun). Unlike TorchOpt: rank
and world size come from the live RPC world, not from variables frozen at import, and rank
decorators decide when the function is called; notebook-cell code travels by value;
``mean_reducer`` weights partitions by size (an uneven split gives the true batch mean);
partitioners pickle; a failing partition raises ``PartitionError`` naming the rank, worker and
error; ``barrier`` raises ``BarrierError`` instead of passing.
"""

from __future__ import annotations

from . import autograd
from .autoinit import auto_init_rpc
from .clone import module_clone
from .failures import BarrierError, PartitionError, PartitionFailure
from .on_ranks import not_on_rank, on_rank, rank_all, rank_non_zero_only, rank_zero_only
from .parallelize import parallelize, parallelize_async, parallelize_sync
from .partition import (
    Partition,
    TensorDimensionPartitioner,
    batch_partitioner,
    dim_partitioner,
    exclusive_batch_partitioner,
)
from .reduce import PartitionResults, mean_reducer, sum_reducer
from .remote import UNSET_RPC_TIMEOUT, remote_async_call, remote_sync_call
from .sync import barrier
from .whoami import (
    WorldInfo,
    get_local_rank,
    get_local_world_size,
    get_rank,
    get_worker_id,
    get_worker_name,
    get_world_info,
    get_world_rank,
    get_world_size,
)

__all__ = [
    "BarrierError",
    "Partition",
    "PartitionError",
    "PartitionFailure",
    "PartitionResults",
    "TensorDimensionPartitioner",
    "UNSET_RPC_TIMEOUT",
    "WorldInfo",
    "auto_init_rpc",
    "autograd",
    "barrier",
    "batch_partitioner",
    "dim_partitioner",
    "exclusive_batch_partitioner",
    "get_local_rank",
    "get_local_world_size",
    "get_rank",
    "get_worker_id",
    "get_worker_name",
    "get_world_info",
    "get_world_rank",
    "get_world_size",
    "is_available",
    "mean_reducer",
    "module_clone",
    "not_on_rank",
    "on_rank",
    "parallelize",
    "parallelize_async",
    "parallelize_sync",
    "rank_all",
    "rank_non_zero_only",
    "rank_zero_only",
    "remote_async_call",
    "remote_sync_call",
    "sum_reducer",
]


def is_available() -> bool:
    """Whether this torch build has RPC and distributed autograd."""
    import torch.distributed as dist
    import torch.distributed.rpc as rpc

    return bool(dist.is_available() and rpc.is_available() and autograd.is_available())
